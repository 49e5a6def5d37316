/* Helper threads beside the event loop (io layer): the output writers and the TLS handshaker. */
#ifndef AMQPTAP_THREAD_H
#define AMQPTAP_THREAD_H

#include <pthread.h>

/* Starts fn(arg) on a thread that takes no signals (they are the loop's: a helper must neither take them nor be
 * woken by them), named `name` (cut to the 15 bytes Linux keeps) for top -H and ps -L. Returns 0 or an errno. */
int tap_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg, const char *name);

#endif
