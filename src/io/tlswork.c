/* The handshaker: one thread beside the event loop that runs the costly
 * step of a client's TLS handshake (its ClientHello answered with the
 * server's flight, whose signature is most of a handshake's CPU), so that a
 * burst of new clients neither holds up the sessions already carrying
 * traffic nor waits while a CPU idles. Steps run in the order their clients
 * arrived, as HAProxy's scheduler runs its "heavy" TLS tasklets.
 *
 * A step is handed over with the leg's SSL and socket; until it comes back
 * the loop touches neither (the leg's events are off, tap_tls_apart keeps
 * the SSL's reads out of the buffer the loop's legs share). The thread
 * touches nothing else: the key log is written through its own lock.
 * Results come back on a list the loop takes from when an eventfd says so.
 *
 *   job:  TODO --thread--> RUNNING --> DONE --loop--> tlsleg.c's callback
 *
 * A leg freed while its job is out cancels it: a job still to do or done is
 * dropped, a running one is waited for (one signature at most). */
#include "proxy_int.h"

#include "amqptap/thread.h"
#include "amqptap/tls.h"

#include <errno.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

struct tls_job {
	TAILQ_ENTRY(tls_job) link;
	enum { TODO, RUNNING, DONE } at; /* under the lock */
	struct leg *leg; /* the loop's: the thread never touches it */
	struct ssl_st *ssl;
	int fd;
	/* the outcome */
	bool gone; /* the client had closed its connection: no step was run */
	enum tap_tls_step step;
	int err;
	char why[160];
};

TAILQ_HEAD(job_list, tls_job);

struct tap_tls_work {
	pthread_mutex_t mu;
	pthread_cond_t wake; /* the thread: a job was queued, or stop */
	pthread_cond_t ran;  /* the loop: a job finished running */
	struct job_list todo, done;
	bool stop;
	pthread_t thread;
	bool started;
	int efd; /* written when `done` gets its first job */
	struct event *ev;
	tap_tls_work_done_fn on_done;
};

/* The client closed (or reset) its connection while it waited: in a storm,
 * clients that give up and reconnect would otherwise cost a signature each
 * time. */
static bool gone(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof ti;
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
		return false;
	return ti.tcpi_state != TCP_ESTABLISHED;
}

static void run(struct tls_job *j)
{
	j->gone = gone(j->fd);
	if (j->gone)
		return;
	tap_tls_apart(j->ssl);
	j->step = tap_tls_handshake(j->ssl, j->why, sizeof j->why);
	j->err = errno;
	tap_tls_rejoin(j->ssl);
}

/* The handshaker's nice value (the loop's is the process's, 0 unless set):
 * where both want one CPU, the loop, which moves the traffic of sessions
 * already set up, gets about three quarters of it. Measured on the 2-core
 * bench box, 1,000 TLS clients at once with a W=1 publisher connected
 * before them (tests/bench/bench_storm.c, alternating rounds): last client
 * confirmed after 8.0-9.0 s at nice 0, 7.8-8.0 s at 5, 7.7-8.5 s at 10,
 * 7.8-8.2 s at 19, HAProxy 7.4-10.2 s; the publisher's worst confirm
 * 2.1-2.5 s, 1.2-2.4 s, 0.9-2.6 s, 0.7-1.5 s, HAProxy's 2.2-3.3 s. The
 * other side: with a busy loop in the tap's session on the tap's CPU, 300
 * clients took 3.7-3.8 s at nice 0, 3.9-4.5 s at 5, 6.6-8.9 s at 10. */
#define HANDSHAKER_NICE 5

static void *thread_main(void *arg)
{
	struct tap_tls_work *w = arg;
	(void)setpriority(PRIO_PROCESS, (id_t)gettid(), HANDSHAKER_NICE); /* failing that, it runs as the loop does */
	pthread_mutex_lock(&w->mu);
	for (;;) {
		struct tls_job *j;
		while (!w->stop && TAILQ_EMPTY(&w->todo))
			pthread_cond_wait(&w->wake, &w->mu);
		if (w->stop)
			break;
		j = TAILQ_FIRST(&w->todo);
		TAILQ_REMOVE(&w->todo, j, link);
		j->at = RUNNING;
		pthread_mutex_unlock(&w->mu);
		run(j);
		pthread_mutex_lock(&w->mu);
		j->at = DONE;
		pthread_cond_broadcast(&w->ran);
		bool first = TAILQ_EMPTY(&w->done);
		TAILQ_INSERT_TAIL(&w->done, j, link);
		if (first) {
			uint64_t one = 1;
			(void)!write(w->efd, &one, sizeof one);
		}
	}
	pthread_mutex_unlock(&w->mu);
	OPENSSL_thread_stop();
	return NULL;
}

/* The loop: hands back finished steps one at a time (the callback may end
 * sessions, whose legs then cancel their own jobs). */
static void on_done(evutil_socket_t fd, short what, void *arg)
{
	struct tap_tls_work *w = arg;
	uint64_t n;
	(void)what;
	(void)!read(fd, &n, sizeof n);
	for (;;) {
		pthread_mutex_lock(&w->mu);
		struct tls_job *j = TAILQ_FIRST(&w->done);
		if (j)
			TAILQ_REMOVE(&w->done, j, link);
		pthread_mutex_unlock(&w->mu);
		if (!j)
			return;
		struct leg *l = j->leg;
		l->job = NULL;
		w->on_done(l, j->gone, j->step, j->err, j->why);
		free(j);
	}
}

struct tap_tls_work *tap_tls_work_new(struct event_base *base, tap_tls_work_done_fn on_done_fn)
{
	struct tap_tls_work *w = calloc(1, sizeof *w);
	if (!w)
		return NULL;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->wake, NULL);
	pthread_cond_init(&w->ran, NULL);
	TAILQ_INIT(&w->todo);
	TAILQ_INIT(&w->done);
	w->on_done = on_done_fn;
	w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	w->ev = w->efd >= 0 ? event_new(base, w->efd, EV_READ | EV_PERSIST, on_done, w) : NULL;
	if (!w->ev || event_add(w->ev, NULL) < 0) {
		tap_tls_work_free(w);
		return NULL;
	}
	int rc = tap_thread_start(&w->thread, thread_main, w, "tls-handshaker");
	if (rc != 0) {
		tap_tls_work_free(w);
		errno = rc;
		return NULL;
	}
	w->started = true;
	return w;
}

bool tap_tls_work_add(struct tap_tls_work *w, struct leg *l)
{
	struct tls_job *j = calloc(1, sizeof *j);
	if (!j)
		return false;
	j->leg = l;
	j->ssl = l->ssl;
	j->fd = l->fd;
	l->job = j;
	pthread_mutex_lock(&w->mu);
	TAILQ_INSERT_TAIL(&w->todo, j, link);
	pthread_cond_signal(&w->wake);
	pthread_mutex_unlock(&w->mu);
	return true;
}

void tap_tls_work_cancel(struct tap_tls_work *w, struct leg *l)
{
	struct tls_job *j = l->job;
	if (!j)
		return;
	l->job = NULL;
	pthread_mutex_lock(&w->mu);
	while (j->at == RUNNING) /* the leg's SSL and socket are in use */
		pthread_cond_wait(&w->ran, &w->mu);
	TAILQ_REMOVE(j->at == TODO ? &w->todo : &w->done, j, link);
	pthread_mutex_unlock(&w->mu);
	free(j);
}

void tap_tls_work_free(struct tap_tls_work *w)
{
	if (!w)
		return;
	if (w->started) {
		pthread_mutex_lock(&w->mu);
		w->stop = true;
		pthread_cond_signal(&w->wake);
		pthread_mutex_unlock(&w->mu);
		pthread_join(w->thread, NULL);
	}
	struct tls_job *j;
	while ((j = TAILQ_FIRST(&w->todo)) != NULL) {
		TAILQ_REMOVE(&w->todo, j, link);
		free(j);
	}
	while ((j = TAILQ_FIRST(&w->done)) != NULL) {
		TAILQ_REMOVE(&w->done, j, link);
		free(j);
	}
	if (w->ev)
		event_free(w->ev);
	if (w->efd >= 0)
		close(w->efd);
	pthread_cond_destroy(&w->wake);
	pthread_cond_destroy(&w->ran);
	pthread_mutex_destroy(&w->mu);
	free(w);
}
