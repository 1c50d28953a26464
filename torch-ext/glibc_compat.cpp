// libstdc++ from GCC >= 11 built against glibc >= 2.32 reads the glibc 2.32
// variable __libc_single_threaded to skip atomic reference counting in
// single-threaded programs. Referencing it would make the extension need
// glibc 2.32 and fail the manylinux_2_28 check. This hidden definition
// satisfies the reference inside the .so instead; 0 ("maybe multi-threaded")
// keeps every reference count atomic, which is always correct.
// With kernel-builder's glibc 2.28 toolchain nothing references it and this
// definition is simply unused.
#ifndef LTX_NO_GLIBC_COMPAT
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
#endif
