/* Helper threads beside the event loop (io layer): the output writers, the TLS handshaker and the --metrics http
 * thread. */
#ifndef AMQPTAP_THREAD_H
#define AMQPTAP_THREAD_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Starts fn(arg) on a thread that takes no signals (they are the loop's: a helper must neither take them nor be
 * woken by them), named `name` (cut to the 15 bytes Linux keeps) for top -H and ps -L. Returns 0 or an errno. */
int tap_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg, const char *name);

/* A condition variable whose timed waits count on CLOCK_MONOTONIC (a clock set back or forward moves no deadline),
 * and such a deadline from a tap_out_clock_us time. */
void tap_cond_init_mono(pthread_cond_t *cond);
struct timespec tap_mono_abs(int64_t mono_us);

#endif
