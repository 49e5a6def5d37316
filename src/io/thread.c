/* Helper threads: see include/amqptap/thread.h. */
#include "amqptap/thread.h"

#include <signal.h>
#include <stdio.h>

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
