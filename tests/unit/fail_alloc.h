/* Allocation failure on demand for the unit tests: while fail_alloc is set in a thread, malloc, calloc and realloc
 * called from that thread return NULL (errno ENOMEM), while fail_realloc is, realloc alone; other threads (an
 * output's writer) are not touched. Include it in one file of a test program. Sanitizer builds replace the
 * allocator themselves: there FAIL_ALLOC_WORKS is not defined and nothing is interposed, so tests that need it are
 * left out. */
#ifndef TAP_FAIL_ALLOC_H
#define TAP_FAIL_ALLOC_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define FAIL_ALLOC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAIL_ALLOC_SANITIZED 1
#endif
#endif

#ifndef FAIL_ALLOC_SANITIZED
#define FAIL_ALLOC_WORKS 1

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);

/* volatile: the compiler knows malloc as a builtin that reads no memory of the program's, and would otherwise be
 * free to move a change of the flag across a call in the same file */
static _Thread_local volatile bool fail_alloc;
static _Thread_local volatile bool fail_realloc; /* realloc alone (a buffer growing) */

void *malloc(size_t n)
{
	if (fail_alloc) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
	if (fail_alloc) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
	if (fail_alloc || fail_realloc) {
		errno = ENOMEM;
		return NULL;
	}
	return __libc_realloc(p, n);
}

/* Around the test's own allocations inside a callback from the code under test. */
#define FAIL_ALLOC_PAUSE()                                                                                           \
	bool fail_alloc_was = fail_alloc, fail_realloc_was = fail_realloc;                                           \
	fail_alloc = fail_realloc = false;                                                                           \
	__asm__ volatile("" ::: "memory")
#define FAIL_ALLOC_RESUME()                                                                                          \
	__asm__ volatile("" ::: "memory");                                                                           \
	fail_alloc = fail_alloc_was;                                                                                 \
	fail_realloc = fail_realloc_was
#else
#define FAIL_ALLOC_PAUSE() ((void)0)
#define FAIL_ALLOC_RESUME() ((void)0)
#endif

#endif
