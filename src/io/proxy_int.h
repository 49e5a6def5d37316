/* What the forwarding engine's files share (io layer, private): a
 * session, its two legs and the proxy. Calls point one way:
 *
 *   proxy.c      the listener, setting up and freeing the proxy
 *     session.c  the session policy: accept, upstream connect and failover,
 *                setup and drain timers, FIN passing, teardown
 *       relay.c  the one read loop of both transports: reserve on the peer's
 *                queue, read, observe, commit, account, high-water budget
 *         plainleg.c, tlsleg.c   a leg's transport (struct leg_ops): plain TCP,
 *                or TLS through OpenSSL on the leg's own socket (tlswork.c:
 *                clients' first handshake steps on a thread of their own)
 *           leg.c  helpers every layer above uses: watching events, the
 *                setup timer, addresses, the clock
 *
 * What goes back up (a leg ended, drained, a client waits for its broker)
 * goes through px->up, the session's struct leg_up; a leg's read event runs
 * px->readable, the relay's read callback (and a TLS read that waited for
 * the socket to be writable px->read, its loop). */
#ifndef AMQPTAP_IO_PROXY_INT_H
#define AMQPTAP_IO_PROXY_INT_H

#include "amqptap/proxy.h"
#include "amqptap/tls.h"

#include <event2/util.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

struct bufferevent;
struct event;
struct event_base;
struct evbuffer;
struct evconnlistener;
struct ssl_st;

enum side { SIDE_CLIENT = 0, SIDE_UPSTREAM = 1 };

struct leg;
struct tap_session;
struct iovec;

/* How a leg's read ended (struct leg_read). */
enum leg_read_end {
	LEG_READ_FULL,  /* the space was filled: the socket (or OpenSSL) may hold more */
	LEG_READ_EMPTY, /* nothing more to read now */
	LEG_READ_WAIT,  /* nothing was there (EAGAIN; TLS: a record is incomplete, or a write must come first) */
	LEG_READ_EOF,   /* the peer closed (FIN, or TLS close_notify) */
	LEG_READ_ERROR, /* the read failed: err and why say why */
};

/* What a leg's recv says besides the bytes it read. */
struct leg_read {
	enum leg_read_end end;
	int err;       /* LEG_READ_EOF, LEG_READ_ERROR: the errno */
	char why[160]; /* LEG_READ_ERROR: OpenSSL's reason, "" when none */
};

/* A leg's transport (as nginx's c->recv/c->send or HAProxy's xprt_ops):
 * plain TCP (plainleg.c) or TLS (tlsleg.c). The relay calls recv and send
 * once per read and write; everything else is off the per-read path. */
struct leg_ops {
	/* Makes the leg on socket fd, accepted, or -1: an upstream not connected yet (the socket is the leg's,
	 * also on failure). Returns 0 or an errno. */
	int (*open)(struct leg *l, evutil_socket_t fd);
	/* Starts connecting the upstream leg to its address; 0, an errno (EMFILE/ENFILE: out of descriptors) or
	 * LEG_NO_MEMORY (the connect is under way, there was no memory for the rest). */
	int (*connect)(struct leg *l);
	/* Reads into iov[0..n) (n <= read_vecs); returns the bytes read, and in rd what comes next. */
	size_t (*recv)(struct leg *l, const struct iovec *iov, int n, struct leg_read *rd);
	/* Writes to a leg whose queue is empty, straight from data; returns how many it took. What it did not
	 * take must be queued next (a TLS write that was interrupted is repeated from there). */
	size_t (*send)(struct leg *to, const void *data, size_t len);
	/* One read of what a closing leg still holds, up to cap bytes; 0 when there is nothing more. */
	size_t (*recv_rest)(struct leg *l, void *buf, size_t cap);
	/* A read wakeup that is the transport's own (TLS: a handshake step, a write that waited for the socket to
	 * be readable); NULL for plain legs. The session may be gone on return. */
	void (*readable)(struct leg *l);
	/* Applies l->reading to the leg's read event. */
	void (*apply_reading)(struct leg *l);
	/* Calls px->up->written once the leg's queue drained to `low` bytes. */
	void (*set_low_water)(struct leg *l, size_t low);
	/* From now on a write that makes no progress for TAP_PROXY_DRAIN_SECONDS ends the session. */
	void (*drain)(struct leg *l);
	/* Frees the transport and closes the socket (TLS: close_notify unless it failed or the client is reset);
	 * the read event is freed before. */
	void (*free)(struct leg *l);
	size_t read_space; /* how much the relay reserves on the peer's queue for one recv */
	int read_vecs;     /* ... in at most this many pieces */
	bool holds_input;  /* reads can leave bytes the socket's readiness does not announce (OpenSSL's records) */
};

/* connect's "no memory" (the connect itself did not fail). */
#define LEG_NO_MEMORY (-1)

extern const struct leg_ops tap_plain_leg_ops;
extern const struct leg_ops tap_tls_leg_ops;

/* What the relay and the legs tell the session (session.c), the one way up. */
struct leg_up {
	/* Something happened to a leg (libevent's BEV_EVENT_* bits): connected,
	 * timed out, EOF or error; err is the errno, why OpenSSL's reason for a TLS
	 * failure or NULL. The session may be gone on return. */
	void (*event)(struct leg *l, short what, int err, const char *why);
	/* A leg's output drained to its low watermark. The session may be gone on return. */
	void (*written)(struct leg *l);
	/* A client leg that is not read until the broker is connected: a client that goes away meanwhile (FIN or
	 * reset) is seen within half a second and read from then on. */
	void (*await_broker)(struct leg *client);
	/* A client to be reset (s->reset_later) spoke: the session ends now. */
	void (*end)(struct tap_session *s);
};

/* One side of a session. A plain leg is read by the relay and written
 * through its bufferevent (plainleg.c); a TLS leg's socket is read and
 * written by OpenSSL (tlsleg.c) and only its plaintext queue `out` is an
 * evbuffer. */
struct leg {
	const struct leg_ops *ops;
	struct tap_session *s;
	struct leg *peer; /* the session's other leg */
	enum side side;
	enum tap_dir from_here;    /* the direction of the bytes read from this leg */
	struct evbuffer *out;      /* bytes waiting for this leg's socket (plaintext); NULL once the leg is gone */
	struct bufferevent *bev;   /* plain legs: writes `out`, its output */
	struct ssl_st *ssl;        /* TLS legs */
	struct event *rd;          /* its socket is readable: runs px->readable (relay.c) */
	struct event *wr;          /* TLS legs: the socket is writable (or the upstream connect is done) */
	struct event *setup_timer; /* until set up (TLS handshake, upstream connect): --handshake-timeout */
	int64_t setup_due_us;      /* ... when it runs out */
	int64_t setup_left_us;     /* a TLS client's time left while its first step is with the handshaker, else 0 */
	struct tls_job *job;       /* TLS client legs: the handshake step the handshaker has (tlswork.c) */
	evutil_socket_t fd;        /* -1 until the socket exists */
	size_t low_water;          /* TLS legs: px->up->written once `out` drains to this */
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
	/* --fault: both directions go through this rewriter (faultio.c); NULL without rules: bytes go on as read */
	struct tap_fault_conn *fault;
	struct event *fault_hold; /* the held broker bytes are due */
	struct event *fault_kill; /* a kill waited long enough for the broker's confirm, or it came */
	struct event *fault_block; /* a block's time is over */
	bool fault_kill_armed;
	bool fault_blocked; /* block: the client is not read (tap_relay_start_reading keeps it so) */
	bool fault_full[2]; /* indexed by enum side: the rewriter holds too much of what that side sent: it is not read
	                       (tap_relay_start_reading keeps it so) until released */
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
	const struct leg_up *up; /* the session's (session.c) */
	void (*readable)(evutil_socket_t fd, short what, void *leg); /* every leg's read event: the relay's */
	void (*read)(struct leg *l); /* the relay's read loop, for a TLS read that waited for the socket writable */
	struct tap_fault_set *faults; /* NULL: no fault rules */
};

/* leg.c: what every layer above a leg uses. */

/* tap_now_us (leg.c), inline where it runs for every read. */
static inline int64_t tap_leg_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* "ip:port" or "[ip6]:port" (an IPv4-mapped address as the IPv4 one). */
void tap_format_sockaddr(const struct sockaddr *sa, char *out, size_t cap);
void tap_set_nodelay(evutil_socket_t fd);
/* Adds ev, one of l's events or timers (NULL: one that could not be made),
 * with timeout tv. Where libevent has no memory for it, nothing might ever
 * wake the leg again: its read event is made active instead (that needs no
 * memory) and its read callback ends the session (tap_leg_end_unwatched). */
void tap_leg_watch(struct leg *l, struct event *ev, const struct timeval *tv);
/* A leg tap_leg_watch failed for: ends its session; true (it may be gone). Its read callback asks first (the
 * relay's end_if_unwatched, testing l->unwatched inline on every read). */
bool tap_leg_end_unwatched(struct leg *l);
/* Starts the --handshake-timeout clock of a leg not yet set up (a TLS handshake, an upstream connect); running
 * out is a BEV_EVENT_TIMEOUT event. */
void tap_leg_arm_setup(struct leg *l);
/* The upstream leg's TCP connect completed (a TLS leg's handshake is still to
 * come): its own address is the client the broker sees, told to the observer. */
void tap_leg_tcp_up(struct leg *l);
/* Makes l->rd, the read event of l's socket l->fd (running px->readable, the relay's); false without memory. */
bool tap_leg_new_read_event(struct leg *l);
/* Whether l is a client leg not to be read yet: its broker is not connected (see connect_upstream in
 * session.c). */
bool tap_leg_awaits_broker(const struct leg *l);

/* relay.c: moving bytes from one leg to the other. */

/* px->readable: reads a leg (and shows the bytes to the observer) until it is empty, up to
 * TAP_PROXY_HIGH_WATER per wakeup. */
void tap_relay_readable(evutil_socket_t fd, short what, void *leg);
/* px->read: the loop of tap_relay_readable, for a leg that is handshaken (TLS) and is to be read now. */
void tap_relay_read(struct leg *from);
/* Reading from a leg: wanted from now on (backpressure lifted, the leg can be read), not wanted (backpressure,
 * EOF), or the wish kept applied again now that the leg can be read (connected). A client waiting for its
 * broker is not read whatever the wish. */
void tap_relay_start_reading(struct leg *l);
void tap_relay_stop_reading(struct leg *l);
void tap_relay_apply_reading(struct leg *l);
/* Reads what a leg sent that still sits unread in its socket, observed and passed on as far as it goes. */
void tap_relay_read_rest(struct leg *l);

/* Passes bytes to `to` as they are: into its socket when nothing waits, else onto its output (relay.c). */
void tap_relay_forward(struct leg *to, const void *data, size_t len);
/* Counts and shows bytes read from `from` (relay.c). */
void tap_relay_account_observe(struct leg *from, const void *data, size_t len, int64_t now);

/* faultio.c: --fault, a session's rewriter between the relay and the legs. */

/* Makes s->fault (and its timers) when the proxy has rules; false only without memory for the timers. */
bool tap_fault_session_open(struct tap_session *s, const char *client);
void tap_fault_session_free(struct tap_session *s);
/* The relay's pass_on for a session with a rewriter: bytes read from `from` fed to it, then counted and shown. */
void tap_fault_pass_on(struct leg *from, const void *data, size_t len, int64_t now);
/* session.c: a kill rule ends the session: the client is reset, or sent connection.close 320 and closed; the
 * broker's connection is closed. */
void tap_session_fault_kill(struct tap_session *s, enum tap_fault_kill_mode mode, uint32_t rule);

/* plainleg.c, tlsleg.c: the two struct leg_ops above. tlsleg.c also: */

/* What TLS legs share, set up and torn down with the proxy: the
 * handshaker and the once-a-second sweep that decides which legs keep
 * their record buffers. */
int tap_tls_proxy_init(struct tap_proxy *px);
void tap_tls_proxy_free(struct tap_proxy *px);

/* session.c, for proxy.c: */

extern const struct leg_up tap_session_up;
/* A client was accepted on fd (its address sa): its session begins. */
void tap_session_accept(struct tap_proxy *px, evutil_socket_t fd, const struct sockaddr *sa);
/* accept() failed with err: out of descriptors pauses accepting for a while. */
void tap_session_accept_failed(struct tap_proxy *px, int err);
/* Ends a session, reading what either side had sent first (shutdown). */
void tap_session_close(struct tap_session *s);
/* New sessions go to upstream address number `at`. */
void tap_session_use_upstream(struct tap_proxy *px, size_t at);
/* The timers of a descriptor shortage (px->shortage_over, px->resume_accept). */
void tap_session_on_shortage_over(evutil_socket_t fd, short what, void *px);
void tap_session_on_resume_accept(evutil_socket_t fd, short what, void *px);

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
