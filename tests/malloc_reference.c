/* An independent reference for the CPU figures: every malloc-family call of the process,
 * counted by usable size, with the running total's peak. Loaded with LD_PRELOAD; read
 * through ctypes (memref_current, memref_peak, memref_reset_peak). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

static void *(*real_malloc)(size_t);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static void (*real_free)(void *);
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);

static _Atomic long long current, peak;
static char boot[65536]; /* dlsym's own allocations, before the real ones are known */
static size_t boot_used;
static int starting;

static void start(void) {
    starting = 1;
    real_malloc = dlsym(RTLD_NEXT, "malloc");
    real_calloc = dlsym(RTLD_NEXT, "calloc");
    real_realloc = dlsym(RTLD_NEXT, "realloc");
    real_free = dlsym(RTLD_NEXT, "free");
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    real_memalign = dlsym(RTLD_NEXT, "memalign");
    starting = 0;
}

static int in_boot(void *p) { return (char *)p >= boot && (char *)p < boot + sizeof boot; }

static void *boot_alloc(size_t n) {
    size_t at = (boot_used + 15) & ~(size_t)15;
    if (at + n > sizeof boot) return NULL;
    boot_used = at + n;
    return boot + at;
}

static void *counted(void *p) {
    if (p) {
        long long n = (long long)malloc_usable_size(p);
        long long now = atomic_fetch_add(&current, n) + n;
        long long top = atomic_load(&peak);
        while (now > top && !atomic_compare_exchange_weak(&peak, &top, now)) {
        }
    }
    return p;
}

static void uncount(void *p) {
    if (p) atomic_fetch_sub(&current, (long long)malloc_usable_size(p));
}

void *malloc(size_t n) {
    if (!real_malloc) {
        if (starting) return boot_alloc(n);
        start();
    }
    return counted(real_malloc(n));
}

void *calloc(size_t a, size_t b) {
    if (!real_calloc) {
        if (starting) {
            void *p = boot_alloc(a * b);
            if (p) memset(p, 0, a * b);
            return p;
        }
        start();
    }
    return counted(real_calloc(a, b));
}

void free(void *p) {
    if (!p || in_boot(p)) return;
    if (!real_free) start();
    uncount(p);
    real_free(p);
}

void *realloc(void *p, size_t n) {
    if (!real_realloc) start();
    if (in_boot(p)) {
        void *q = malloc(n);
        if (q) memcpy(q, p, n);
        return q;
    }
    long long old = p ? (long long)malloc_usable_size(p) : 0;
    void *q = real_realloc(p, n);
    if (q || n == 0) atomic_fetch_sub(&current, old);
    return q ? counted(q) : q;
}

int posix_memalign(void **out, size_t align, size_t n) {
    if (!real_posix_memalign) start();
    int rc = real_posix_memalign(out, align, n);
    if (rc == 0) counted(*out);
    return rc;
}

void *aligned_alloc(size_t align, size_t n) {
    if (!real_aligned_alloc) start();
    return counted(real_aligned_alloc(align, n));
}

void *memalign(size_t align, size_t n) {
    if (!real_memalign) start();
    return counted(real_memalign(align, n));
}

long long memref_current(void) { return atomic_load(&current); }
long long memref_peak(void) { return atomic_load(&peak); }
void memref_reset_peak(void) { atomic_store(&peak, atomic_load(&current)); }
