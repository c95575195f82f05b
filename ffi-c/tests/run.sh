#!/usr/bin/env bash
# The C API's checks: installs the library into a scratch prefix, builds the
# C tests (C11, warnings as errors, pedantic) against the static and the
# shared library through pkg-config, compiles the header as C++17, builds
# the examples, and runs the tests plain and under valgrind. Prints one
# "test result" line per passing program; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
PREFIX=$prefix ffi-c/install.sh
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cflags="-std=c11 -Wall -Wextra -Werror -pedantic -g $(pkg-config --cflags cxlkv)"
static_libs="$prefix/lib/libcxlkv.a $(pkg-config --libs-only-other --static cxlkv) -lpthread -ldl -lm"
shared_libs="$(pkg-config --libs cxlkv) -Wl,-rpath,$prefix/lib"
bin=$prefix/bin
mkdir -p "$bin"

run() { # name, command...
  local name=$1
  shift
  if timeout 300 "$@"; then
    echo "test result: ok. 1 passed; 0 failed ($name)"
  else
    echo "$name: 1 failed"
    return 1
  fi
}

status=0
for t in test_api test_fork; do
  # shellcheck disable=SC2086
  gcc $cflags -Iffi-c/tests "ffi-c/tests/$t.c" -o "$bin/$t-static" $static_libs
  # shellcheck disable=SC2086
  gcc $cflags -Iffi-c/tests "ffi-c/tests/$t.c" -o "$bin/$t-shared" $shared_libs
  run "$t (static)" "$bin/$t-static" || status=1
  run "$t (shared)" "$bin/$t-shared" || status=1
  run "$t (shared, valgrind: no errors, no leaks)" valgrind -q --error-exitcode=9 --leak-check=full \
    --errors-for-leak-kinds=definite,indirect,possible "$bin/$t-shared" || status=1
done

# The shared library names its ABI, and programs record that name.
soname=$(readelf -d "$prefix/lib/libcxlkv.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
needed=$(readelf -d "$bin/test_api-shared" | sed -n 's/.*Shared library: \[\(libcxlkv[^]]*\)\].*/\1/p')
if [ -n "$soname" ] && [ "$needed" = "$soname" ] && [ -e "$prefix/lib/$soname" ]; then
  echo "test result: ok. 1 passed; 0 failed (libcxlkv.so has SONAME $soname, programs need it by that name)"
else
  echo "SONAME: 1 failed (soname '$soname', programs need '$needed')"
  status=1
fi

# The GPU path: checked on a GPU (exit 0), or reported unavailable (exit 2).
# shellcheck disable=SC2086
gcc $cflags -Iffi-c/tests ffi-c/tests/test_cuda.c -o "$bin/test_cuda" $static_libs
set +e
timeout 300 "$bin/test_cuda"
crc=$?
set -e
case $crc in
  0) echo "test result: ok. 1 passed; 0 failed (test_cuda: GPU path on a GPU)" ;;
  2) echo "test result: ok. 1 passed; 0 failed (test_cuda: CUDA unavailable, reported as such)" ;;
  *) echo "test_cuda: 1 failed (exit $crc)"; status=1 ;;
esac

# shellcheck disable=SC2086
g++ -std=c++17 -Wall -Wextra -Werror -pedantic $(pkg-config --cflags cxlkv) ffi-c/tests/header.cpp \
  -o "$bin/header" $shared_libs
run "header compiles as C++17" "$bin/header" || status=1
# shellcheck disable=SC2086
gcc $cflags ffi-c/examples/hello.c -o "$bin/hello" $shared_libs
run "example hello.c" "$bin/hello" || status=1
# shellcheck disable=SC2086
g++ -std=c++17 -Wall -Wextra -Werror -pedantic $(pkg-config --cflags cxlkv) ffi-c/examples/raii.cpp \
  -o "$bin/raii" $static_libs
run "example raii.cpp (C++17, static)" "$bin/raii" || status=1
exit $status
