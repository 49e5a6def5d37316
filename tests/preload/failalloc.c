/* An LD_PRELOAD library for the integration tests (test_alloc_failures.py): makes malloc, calloc and realloc fail
 * (NULL, errno ENOMEM) for one call in FAILALLOC_ONE_IN, chosen at random, once FAILALLOC_AFTER_MS milliseconds
 * have passed since the process started (so that it starts up whole), until the file FAILALLOC_STOP_FILE exists
 * (looked for every 10 ms; so that a test can stop the process with allocations working and read its summary).
 * At exit it writes "failalloc: N of M allocations failed" to stderr, so a test can tell that it reached its
 * premise. FAILALLOC_SEED (a number) makes the choice the same from run to run for the same calls in each thread
 * (the default seed is the thread's own address: it differs with every run). FAILALLOC_ONE_IN unset or 0: nothing
 * fails. FAILALLOC_THREAD=N makes the process's Nth pthread_create fail (EAGAIN), whatever else is set: each
 * helper thread's start can be refused in turn. glibc only (__libc_malloc and friends). Not for sanitizer
 * builds: their allocator comes first. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);

static int64_t armed_at_ns = INT64_MAX;
static unsigned fail_thread; /* FAILALLOC_THREAD */
static uint32_t one_in;
static uint64_t seed;
static const char *stop_file;
static atomic_llong stop_checked_ns;
static atomic_bool stopped;
static atomic_ulong calls, failed;
static _Thread_local uint64_t rng; /* xorshift64, seeded per thread */

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

__attribute__((constructor)) static void arm(void)
{
	const char *n = getenv("FAILALLOC_ONE_IN"), *after = getenv("FAILALLOC_AFTER_MS");
	one_in = n ? (uint32_t)strtoul(n, NULL, 10) : 0;
	stop_file = getenv("FAILALLOC_STOP_FILE");
	const char *sd = getenv("FAILALLOC_SEED");
	seed = sd ? strtoull(sd, NULL, 10) : 0;
	const char *th = getenv("FAILALLOC_THREAD");
	fail_thread = th ? (unsigned)strtoul(th, NULL, 10) : 0;
	armed_at_ns = now_ns() + (after ? (int64_t)strtoll(after, NULL, 10) : 0) * 1000000;
}

static int fails(void)
{
	if (!one_in || atomic_load_explicit(&stopped, memory_order_relaxed))
		return 0;
	int64_t now = now_ns();
	if (now < armed_at_ns)
		return 0;
	if (stop_file && now - atomic_load_explicit(&stop_checked_ns, memory_order_relaxed) > 10000000) {
		atomic_store_explicit(&stop_checked_ns, now, memory_order_relaxed);
		if (access(stop_file, F_OK) == 0) {
			atomic_store(&stopped, true);
			return 0;
		}
	}
	atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
	static atomic_uint threads;
	if (!rng) /* a thread's own address, or the seed and the order in which threads made their first call */
		rng = 0x9E3779B97F4A7C15u ^ (seed ? seed * 0x100000001B3u + atomic_fetch_add(&threads, 1)
		                                  : (uint64_t)(uintptr_t)&rng);
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	if (rng % one_in)
		return 0;
	atomic_fetch_add_explicit(&failed, 1, memory_order_relaxed);
	errno = ENOMEM;
	return 1;
}

void *malloc(size_t n)
{
	return fails() ? NULL : __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	return fails() ? NULL : __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	return n && fails() ? NULL : __libc_realloc(p, n);
}

int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	static atomic_uint made;
	static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
	if (fail_thread && atomic_fetch_add(&made, 1) + 1 == fail_thread)
		return EAGAIN;
	if (!real)
		*(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
	return real ? real(thread, attr, fn, arg) : EAGAIN;
}

__attribute__((destructor)) static void report(void)
{
	char line[96]; /* snprintf does not allocate for these conversions */
	int len = snprintf(line, sizeof line, "failalloc: %lu of %lu allocations failed\n",
			   atomic_load(&failed), atomic_load(&calls));
	if (len > 0 && write(STDERR_FILENO, line, (size_t)len) < 0)
		return;
}
