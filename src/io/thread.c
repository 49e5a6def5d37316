/* Helper threads: see include/amqptap/thread.h. */
#include "amqptap/thread.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

int tap_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg, const char *name)
{
	sigset_t all, prev;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &prev);
	int rc = pthread_create(thread, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &prev, NULL);
	if (rc == 0) {
		char cut[16];
		snprintf(cut, sizeof cut, "%s", name);
		(void)pthread_setname_np(*thread, cut); /* a name is a convenience */
	}
	return rc;
}

void tap_cond_init_mono(pthread_cond_t *cond)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cond, &ca);
	pthread_condattr_destroy(&ca);
}

struct timespec tap_mono_abs(int64_t mono_us)
{
	struct timespec ts = {(time_t)(mono_us / 1000000), (long)(mono_us % 1000000) * 1000};
	return ts;
}
