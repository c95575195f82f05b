#!/usr/bin/env bash
# Builds the C library and installs it where C and C++ builds find it:
#   $PREFIX/lib/libcxlkv.so, $PREFIX/lib/libcxlkv.a, $PREFIX/include/cxlkv.h,
#   $PREFIX/lib/pkgconfig/cxlkv.pc
# Usage: PREFIX=/usr/local ffi-c/install.sh      (default PREFIX: /usr/local)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${PREFIX:-/usr/local}
cargo build --release --locked -p cxlkv-ffi-c
version=$(sed -n 's/^#define CXLKV_VERSION_STRING "\(.*\)"$/\1/p' ffi-c/include/cxlkv.h)
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0755 target/release/libcxlkv.so "$prefix/lib/libcxlkv.so"
install -m 0644 target/release/libcxlkv.a "$prefix/lib/libcxlkv.a"
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
echo "installed cxlkv $version under $prefix"
