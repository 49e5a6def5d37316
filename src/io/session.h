/* What the forwarding engine's files share (io layer, private): a
 * session, its two legs and the proxy. proxy.c relays bytes between the
 * legs and owns their lifecycle; tlsleg.c moves the bytes of a TLS leg
 * (handshake, SSL_read, SSL_write on the leg's own socket); tlswork.c runs
 * clients' first handshake steps on a thread of their own. */
#ifndef AMQPTAP_IO_SESSION_H
#define AMQPTAP_IO_SESSION_H

#include "amqptap/proxy.h"
#include "amqptap/tls.h"

#include <event2/util.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/time.h>

struct bufferevent;
struct event;
struct event_base;
struct evbuffer;
struct evconnlistener;
struct ssl_st;

enum side { SIDE_CLIENT = 0, SIDE_UPSTREAM = 1 };

/* One side of a session. A plain leg is read by the session itself and
 * written through its bufferevent; a TLS leg's socket is read and written
 * by OpenSSL (tlsleg.c) and only its plaintext queue `out` is an evbuffer. */
struct leg {
	struct tap_session *s;
	struct leg *peer; /* the session's other leg */
	enum side side;
	enum tap_dir from_here;    /* the direction of the bytes read from this leg */
	struct evbuffer *out;      /* bytes waiting for this leg's socket (plaintext); NULL once the leg is gone */
	struct bufferevent *bev;   /* plain legs: writes `out`, its output */
	struct ssl_st *ssl;        /* TLS legs */
	struct event *rd;          /* the session's own read event */
	struct event *wr;          /* TLS legs: the socket is writable (or the upstream connect is done) */
	struct event *setup_timer; /* until set up (TLS handshake, upstream connect): --handshake-timeout */
	int64_t setup_due_us;      /* ... when it runs out */
	int64_t setup_left_us;     /* a TLS client's time left while its first step is with the handshaker, else 0 */
	struct tls_job *job;       /* TLS client legs: the handshake step the handshaker has (tlswork.c) */
	evutil_socket_t fd;        /* -1 until the socket exists */
	size_t low_water;          /* TLS legs: tap_leg_written once `out` drains to this */
	size_t retry_len;          /* TLS legs: the length an interrupted SSL_write must be repeated with */
	bool tls;                  /* no half-close: a FIN ends the session after draining */
	bool connected;        /* bytes can be written to it: accepted, or the upstream connect (and handshake) done */
	bool tcp_up;           /* TLS upstream legs: the TCP connect completed */
	bool handshaken;       /* TLS legs: the handshake completed */
	bool reading;          /* reading it is wanted (backpressure and EOF turn it off) */
	bool eof;              /* it sent FIN: nothing more to read from it */
	bool shut_wr;          /* we sent it FIN */
	bool draining;         /* TLS legs: a write stuck for TAP_PROXY_DRAIN_SECONDS ends the session */
	bool first_step_done;  /* TLS client legs: the ClientHello was answered (later steps run in the loop) */
	bool read_wants_write; /* TLS legs: SSL_read needs the socket writable */
	bool write_wants_read; /* TLS legs: SSL_write needs the socket readable */
	bool failed;           /* TLS legs: ended by an error (no close_notify) */
	bool unwatched;        /* libevent had no memory to add one of its events or timers (tap_leg_watch) */
	uint32_t ios;          /* TLS legs: reads and writes since the last buffer sweep */
};

struct tap_session {
	TAILQ_ENTRY(tap_session) link;
	struct tap_proxy *px;
	uint64_t id;
	struct leg leg[2]; /* indexed by enum side */
	bool closing;      /* one side is gone (reset): drain the other, then close it */
	bool reset_client; /* the client is closed with a reset (no close_notify either) */
	bool client_spoke; /* a byte came from the client */
	struct event *reset_later; /* the client is to be reset once it speaks, or when this fires */
	struct event *client_gone; /* until the broker is connected (the client is not read): has the client closed? */
	bool client_left;          /* ... it did: read from then on, and sent to no other address */
	enum tap_proxy_end why;
	char detail[160];
	void *obs;
	size_t upstream_at; /* the proxy's upstream address this session goes to (chosen at accept) */
	size_t upstream_tries; /* addresses found unreachable so far: it moves on to the next until it has tried all */
};

TAILQ_HEAD(session_list, tap_session);

struct tap_proxy {
	struct event_base *base;
	struct evconnlistener *listener;
	struct sockaddr_storage upstreams[TAP_PROXY_UPSTREAM_ADDRS]; /* every address of the name, as resolved */
	int upstream_lens[TAP_PROXY_UPSTREAM_ADDRS];
	size_t n_upstreams, upstream_at; /* upstream_at: where new sessions go */
	char upstream_name[300]; /* as configured, for messages */
	char upstream_addr[80];  /* numeric, for observers */
	char upstream_text[80];  /* upstream_text's */
	struct tap_proxy_hooks hooks;
	struct tap_tls *tls;
	struct session_list sessions;
	uint64_t next_id;
	struct tap_proxy_stats stats;
	uint8_t *scratch; /* TAP_PROXY_MAX_IO bytes: reads land here when they can be sent on at once */
	bool stopped;
	bool accept_paused; /* accept() ran out of descriptors: resumed when a session ends, or by resume_accept */
	struct event *resume_accept;
	bool out_of_fds; /* a descriptor shortage was said on stderr and is not over (shortage_over) */
	struct event *shortage_over;
	uint64_t fd_limit_before; /* stats.fd_limit when the shortage began */
	uint64_t accept_pauses;   /* in this shortage */
	uint32_t handshake_ms;    /* 0: setting up a leg may take forever */
	struct tap_tls_work *handshaker; /* TLS listener: the thread for clients' first handshake steps */
	struct event *buffer_sweep; /* TLS: which legs keep their record buffers (tlsleg.c) */
	void (*idle_cb)(void *);
	void *idle_arg;
};

/* proxy.c, for tlsleg.c: */

/* Something happened to a leg (libevent's BEV_EVENT_* bits): connected,
 * timed out, EOF or error; err is the errno, why OpenSSL's reason for a TLS
 * failure or NULL. The session may be gone on return. */
void tap_leg_event(struct leg *l, short what, int err, const char *why);
/* Adds ev, one of l's events or timers (NULL: one that could not be made),
 * with timeout tv. Where libevent has no memory for it, nothing might ever
 * wake the leg again: its read event is made active instead (that needs no
 * memory) and its read callback ends the session (tap_leg_end_if_unwatched). */
void tap_leg_watch(struct leg *l, struct event *ev, const struct timeval *tv);
/* In a leg's read callback, first: true when tap_leg_watch failed for it and
 * the session was ended (it may be gone). */
bool tap_leg_end_if_unwatched(struct leg *l);
/* The upstream leg's TCP connect completed (a TLS leg's handshake is still to
 * come): its own address is the client the broker sees, told to the observer. */
void tap_leg_tcp_up(struct leg *l);
/* Whether l is a client leg not to be read yet: its broker is not connected (see connect_upstream). */
bool tap_leg_awaits_broker(const struct leg *l);
/* A client leg that is not read until the broker is connected: a client that goes away meanwhile (FIN or reset)
 * is seen within half a second and read from then on. */
void tap_leg_await_broker(struct leg *client);
/* A leg's output drained to its low watermark. The session may be gone on
 * return. */
void tap_leg_written(struct leg *l);
/* The peer's output when bytes for it must be queued, else NULL. */
struct evbuffer *tap_leg_queue_for(const struct leg *to);
/* Shows `len` bytes read from `from` to the observer. */
void tap_leg_observe(struct leg *from, const void *data, size_t len, int64_t now);
/* Counts bytes read from `from` and applies backpressure. */
void tap_leg_account(struct leg *from, size_t len);
/* Passes bytes read from `from` to its peer (sent or queued), then
 * observes and counts them. */
void tap_leg_pass_on(struct leg *from, const void *data, size_t len, int64_t now);

/* tlsleg.c: */

/* Makes `l` a TLS leg on the accepted socket fd, waiting for the client's
 * handshake. Returns 0 or an errno. */
int tap_tls_leg_accept(struct leg *l, evutil_socket_t fd);
/* Opens the upstream socket of TLS leg `l` and starts connecting. Returns 0
 * or an errno (EMFILE/ENFILE: out of descriptors). */
int tap_tls_leg_connect(struct leg *l);
/* Writes bytes to a TLS leg whose queue is empty, straight from `data`;
 * returns how many it took. What it did not take must be queued next: an
 * interrupted write is repeated from there (with the length it had). */
size_t tap_tls_leg_send(struct leg *to, const void *data, size_t len);
/* What a session that is ending read from `from` (read_rest): passed on when it can go straight into the
 * peer's socket, else only observed: bytes queued now would be freed unsent, and a client that keeps writing
 * would decide how much memory they take. */
void tap_leg_pass_on_rest(struct leg *from, const void *data, size_t len);
/* Decrypts what a handshaken TLS leg still holds, unread, and passes it on (tap_leg_pass_on_rest): up to `cap`
 * bytes, until its socket is empty (see read_rest in proxy.c). */
void tap_tls_leg_read_rest(struct leg *l, size_t cap);
/* Starts the --handshake-timeout clock of a leg not yet set up (a TLS handshake, an upstream connect). */
void tap_leg_arm_setup(struct leg *l);
/* Applies l->reading to a handshaken TLS leg. */
void tap_tls_leg_reading(struct leg *l);
/* From now on a write that makes no progress for TAP_PROXY_DRAIN_SECONDS
 * ends the session. */
void tap_tls_leg_drain(struct leg *l);
/* Frees everything of a TLS leg (close_notify unless it failed or `reset`). */
void tap_tls_leg_free(struct leg *l, bool reset);
/* What TLS legs share, set up and torn down with the proxy: the
 * handshaker and the once-a-second sweep that decides which legs keep
 * their record buffers. */
int tap_tls_proxy_init(struct tap_proxy *px);
void tap_tls_proxy_free(struct tap_proxy *px);

/* tlswork.c: the handshaker. */

struct tap_tls_work;
/* A step came back to the loop: `gone` if the client had closed its
 * connection (nothing was run), else the step's outcome, errno and reason. */
typedef void (*tap_tls_work_done_fn)(struct leg *l, bool gone, enum tap_tls_step step, int err, const char *why);
/* Starts the thread; NULL (errno set) on failure. */
struct tap_tls_work *tap_tls_work_new(struct event_base *base, tap_tls_work_done_fn on_done);
/* Hands l's next handshake step over; false when out of memory (nothing
 * was handed over). Until it comes back, l's SSL and socket are not the
 * loop's: l's events must be off. */
bool tap_tls_work_add(struct tap_tls_work *w, struct leg *l);
/* Takes l's step back unfinished or finished, waiting for it if it is
 * running; nothing if l has none out. */
void tap_tls_work_cancel(struct tap_tls_work *w, struct leg *l);
/* Stops the thread (the legs must have cancelled their steps). */
void tap_tls_work_free(struct tap_tls_work *w);

#endif
