# Sanitizer settings for fsdpx's instrumented build (sourced by make test-sanitize and
# tests/fuzz/run.sh). LibTorch is not instrumented: its own allocations that live until exit are
# reported by LeakSanitizer as leaks: lsan.supp suppresses those (and says what that costs).
here_sanitize=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# protect_shadow_gap=0: LibTorch's CUDA libraries map memory where ASan would reserve its gap.
# alloc_dealloc_mismatch=0: libc10's static initialisers (CPUAllocator.cpp) free() a string that
# operator new allocated; ASan cannot suppress that by library, so the check (new/delete[] vs
# malloc/free pairs) is off for every library, fsdpx's included. Every other check stays on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:protect_shadow_gap=0:alloc_dealloc_mismatch=0:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here_sanitize/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
