#!/usr/bin/env bash
# Builds the C library and installs it where C and C++ builds find it:
#   $PREFIX/lib/libcxlkv.so.<version> with the SONAME link (libcxlkv.so.0.<minor>
#   while the version is 0.x) and the development link libcxlkv.so,
#   $PREFIX/lib/libcxlkv.a, $PREFIX/include/cxlkv.h, $PREFIX/lib/pkgconfig/cxlkv.pc
# Usage: PREFIX=/usr/local ffi-c/install.sh      (default PREFIX: /usr/local)
# Works under any CARGO_TARGET_DIR: the build's outputs are found through cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${PREFIX:-/usr/local}
cargo build --release --locked -p cxlkv-ffi-c
target=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
out=$target/release
for f in libcxlkv.so libcxlkv.a; do
  [ -f "$out/$f" ] || { echo "install.sh: $out/$f was not built" >&2; exit 1; }
done
version=$(sed -n 's/^#define CXLKV_VERSION_STRING "\(.*\)"$/\1/p' ffi-c/include/cxlkv.h)
soname=$(readelf -d "$out/libcxlkv.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ -n "$soname" ] || { echo "install.sh: libcxlkv.so has no SONAME" >&2; exit 1; }
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 "$out/libcxlkv.so" "$prefix/lib/libcxlkv.so.$version"
ln -sf "libcxlkv.so.$version" "$prefix/lib/$soname"
ln -sf "$soname" "$prefix/lib/libcxlkv.so"
install -m 0644 "$out/libcxlkv.a" "$prefix/lib/libcxlkv.a"
install -m 0644 ffi-c/include/cxlkv.h "$prefix/include/cxlkv.h"
cat > "$prefix/lib/pkgconfig/cxlkv.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: cxlkv
Description: KV-cache object store in shared (CXL) memory
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lcxlkv
Libs.private: -lpthread -ldl -lm
PC
echo "installed cxlkv $version ($soname) under $prefix"
