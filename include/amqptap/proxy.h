/* The forwarding engine (io layer, libevent): accepts clients, opens one
 * upstream connection per client and relays bytes both ways unchanged, with
 * watermark backpressure and drain-then-close. Decoding is an observer: the
 * hooks see a copy of every chunk as it is forwarded and can never delay or
 * alter it. */
#ifndef AMQPTAP_PROXY_H
#define AMQPTAP_PROXY_H


#include "amqptap/dir.h"
#include "amqptap/fault.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct sockaddr;
struct tap_proxy;
struct tap_tls;

/* Why a session ended, as passed to tap_proxy_hooks.close. */
enum tap_proxy_end {
	TAP_END_CLIENT_EOF,
	TAP_END_BROKER_EOF,
	TAP_END_CLIENT_RESET,
	TAP_END_BROKER_RESET,
	TAP_END_UNREACHABLE, /* the upstream connection could not be made */
	TAP_END_SHUTDOWN,    /* the tap closed it (grace period over) */
	TAP_END_CLIENT_TLS,  /* TLS failure with the client (handshake, plaintext client, bad certificate) */
	TAP_END_BROKER_TLS,  /* TLS failure with the broker (verification, handshake) */
	TAP_END_FD_LIMIT,    /* the tap had no file descriptor left for the upstream connection */
	TAP_END_NO_MEMORY,   /* the tap had no memory for it (neither side ended it) */
	TAP_END_FAULT,       /* a --fault kill rule ended it */
};

const char *tap_proxy_end_name(enum tap_proxy_end why);

/* Observer callbacks, all optional. `open` returns the observer's per-session
 * state, handed back to `data` and `close`. `data` sees every chunk in the
 * order it is forwarded (c2s: client to broker); the slice is valid only
 * during the call. `close` is called exactly once per opened session. */
struct tap_proxy_hooks {
	void *ctx;
	void *(*open)(void *ctx, uint64_t conn_id, const char *client, const char *upstream, int64_t now_us);
	void (*data)(void *ctx, void *sess, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us);
	void (*close)(void *ctx, void *sess, uint64_t conn_id, enum tap_proxy_end why, const char *detail,
		      int64_t now_us);
	/* A client closed at once, the tap having no memory for its session: it gets no open, data or close. */
	void (*refused)(void *ctx);
	/* The session's first address was unreachable: it goes to `upstream` (numeric) now, before any byte passed. */
	void (*upstream_moved)(void *ctx, void *sess, const char *upstream);
	/* The session's TCP connection to the broker is up, from `local` (the tap's own address and port on it). */
	void (*upstream_local)(void *ctx, void *sess, uint64_t conn_id, const char *local);
	/* The session stopped (held) or went on reading the broker: its client reads slowly (backpressure). */
	void (*held)(void *ctx, void *sess, bool held, int64_t now_us);
	/* --fault (tap_proxy_set_faults): the client is shown `saw` for a publish, before its confirm is observed;
	 * and a rule acted (struct tap_fault_act). */
	void (*fault_mark)(void *ctx, void *sess, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule);
	void (*fault_act)(void *ctx, void *sess, uint64_t conn_id, const struct tap_fault_act *a, int64_t now_us);
};

struct tap_proxy_stats {
	uint64_t accepted;
	uint64_t active;
	uint64_t unreachable;       /* clients turned away: no address of the broker's name could be reached */
	uint64_t address_failures;  /* connects to one of its addresses that failed (the session may have gone on) */
	uint64_t fd_limit; /* clients closed because the tap had no descriptor for their upstream */
	uint64_t bytes_c2s;
	uint64_t bytes_s2c;
	uint64_t tls_busy_legs; /* TLS legs keeping their record buffers: busy in the last second (src/io/tlsleg.c) */
};

/* Watermark: a side's output buffer above this stops reading the other side. */
#define TAP_PROXY_HIGH_WATER (1024 * 1024)
/* Largest single read or write on a plain TCP leg. */
#define TAP_PROXY_MAX_IO (256 * 1024)
/* Most read from one leg, unread behind backpressure, when its session ends, unless its socket's receive buffer
 * holds more (tap_relay_read_rest in src/io/relay.c). */
#define TAP_PROXY_REST_MAX (16 * 1024 * 1024)
/* After one side is gone, how long the other may take to read what is left. */
#define TAP_PROXY_DRAIN_SECONDS 10
/* Out of file descriptors in accept(): accepting pauses until a session ends,
 * or this long at most. */
#define TAP_PROXY_ACCEPT_PAUSE_MS 250
/* A descriptor shortage is over (and said so on stderr) after this long without one. */
#define TAP_PROXY_FD_QUIET_SECONDS 10
/* A client reset because its broker is unreachable gets its reset once it
 * has spoken (its protocol header), or after this long if it stays silent. */
#define TAP_PROXY_RESET_GRACE_MS 100

/* Creates a proxy that forwards to upstream (resolved by the caller), with
 * TLS on the legs `tls` asks for (NULL: plain TCP both ways; borrowed, must
 * outlive the proxy). Returns NULL with errno set on failure. */
struct tap_proxy *tap_proxy_new(struct event_base *base, const struct sockaddr *upstream, int upstream_len,
				const char *upstream_name, struct tap_tls *tls, const struct tap_proxy_hooks *hooks);
/* Fault rules (borrowed; NULL: none, the default): every session accepted from now on is forwarded through a
 * rewriter under them (include/amqptap/fault.h); without, bytes go on as they arrive. */
void tap_proxy_set_faults(struct tap_proxy *p, struct tap_fault_set *set);
/* The most addresses an upstream name is tried at (tap_proxy_add_upstream). */
#define TAP_PROXY_UPSTREAM_ADDRS 8
/* Another address of the upstream name (a name with A and AAAA records), tried after the one given to
 * tap_proxy_new: a connection that finds the address in use unreachable goes on to the next (round the list) until
 * it has tried them all, and the next connections go to the next address first, so an address that refuses (IPv6
 * on a broker listening on IPv4 only) turns away no client. Returns 0, or -1 when the list is full or len is not an
 * address's. */
int tap_proxy_add_upstream(struct tap_proxy *p, const struct sockaddr *addr, int len);
/* Starts listening on addr; returns 0 or -1 with errno. Writes the bound
 * address ("127.0.0.1:5673") into bound. */
int tap_proxy_listen(struct tap_proxy *p, const struct sockaddr *addr, int addr_len, char *bound, size_t bound_cap);
/* Stops accepting new clients; live sessions go on. */
void tap_proxy_stop_accepting(struct tap_proxy *p);
/* Closes every live session now (each gets close(TAP_END_SHUTDOWN)). */
void tap_proxy_close_all(struct tap_proxy *p);
size_t tap_proxy_active(const struct tap_proxy *p);
void tap_proxy_get_stats(const struct tap_proxy *p, struct tap_proxy_stats *s);
/* Bounds setting up each session's legs: a client's TLS handshake, and the
 * connection to the broker (TCP connect and, with TLS, its handshake). A
 * leg not set up in time ends its session (client_tls_error, unreachable or
 * broker_tls_error). 0: no limit (the default until this is called). */
void tap_proxy_set_handshake_timeout(struct tap_proxy *p, uint32_t ms);
/* Called when the last session ends after tap_proxy_stop_accepting. */
void tap_proxy_on_idle(struct tap_proxy *p, void (*cb)(void *arg), void *arg);
void tap_proxy_free(struct tap_proxy *p);

/* Current time in Unix microseconds (CLOCK_REALTIME). */
int64_t tap_now_us(void);

#endif
