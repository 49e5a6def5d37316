/* AMQP-aware fault injection (--fault ACTION[:KEY=VALUE,...]): the rules, their parser, and the per-connection
 * rewriter that applies them to the two streams of a proxied connection (pure: no I/O; the relay feeds it and
 * writes what it emits). Off unless a rule is configured: a session without rules has no rewriter and its bytes
 * are forwarded as they arrive.
 *
 * The rewriter sees every byte of both directions at frame boundaries. Client to broker it forwards everything
 * unchanged and reads the publishes off it (their confirm sequence numbers, exchange and routing key, where their
 * content ends); a rule that selects a publish remembers its tag. Broker to client it holds a frame only as long
 * as it takes to decide on it: content and large frames stream through, a small method frame is kept until it is
 * complete; a basic.ack or basic.nack that covers a selected tag is rewritten (a `multiple` ack split around it),
 * every other frame passes as it came.
 *
 * latency and bandwidth act on bytes, not frames: what the rewriter emits in a direction a rule selects is held
 * (in order) until it is due (latency) or the direction's rate allows it (bandwidth), and released by
 * tap_fault_release at tap_fault_due(). */
#ifndef AMQPTAP_FAULT_H
#define AMQPTAP_FAULT_H

#include "amqptap/dir.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_FAULT_RULES_MAX 16       /* rules at one time (command line and API together) */
#define TAP_FAULT_SPEC_MAX 512       /* bytes of one rule's text */
#define TAP_FAULT_TAGS_MAX 4096      /* selected publishes awaiting their confirm, per connection */
#define TAP_FAULT_HOLD_MAX (4u << 20) /* broker bytes held back by delay-confirms before the broker is not read */
#define TAP_FAULT_KILL_WAIT_MS 2000  /* kill: longest wait for the broker's confirm of the selected publish */
#define TAP_FAULT_SHAPE_MAX (1u << 20) /* latency, bandwidth: bytes held per direction before its sender is not read */
#define TAP_FAULT_PACE_MS 10         /* bandwidth: at most this long's worth of bytes goes at once (the burst) */
#define TAP_FAULT_KIB_MAX (16u << 20) /* bandwidth: the highest rate, KiB/s (16 GiB/s) */
/* return, return-after-ack: the selected publish's content (header and body frames as the client sent them) is
 * kept until its confirm; one larger than this is not kept (its fault record says "skipped":"too_large"), nor one
 * past TAP_FAULT_RETURN_HELD_MAX kept on the connection at once */
#define TAP_FAULT_RETURN_CONTENT_MAX (128u << 10)
#define TAP_FAULT_RETURN_HELD_MAX (4u << 20)
#define TAP_FAULT_CLOSE_TEXT_MAX 200 /* close-channel:text= */

enum tap_fault_action {
	TAP_FAULT_NACK,
	TAP_FAULT_WITHHOLD,
	TAP_FAULT_DELAY,
	TAP_FAULT_KILL,
	TAP_FAULT_CLOSE_CHANNEL,
	TAP_FAULT_BLOCK,
	TAP_FAULT_RETURN,
	TAP_FAULT_RETURN_AFTER_ACK,
	TAP_FAULT_STALL_HEARTBEATS,
	TAP_FAULT_LATENCY,
	TAP_FAULT_BANDWIDTH,
	TAP_FAULT_ACTIONS,
};

/* "nack", "withhold-confirms", ... as rules and records name them. */
const char *tap_fault_action_name(enum tap_fault_action a);

/* Which direction a latency or bandwidth rule acts on. */
enum tap_fault_way {
	TAP_FAULT_BOTH, /* default */
	TAP_FAULT_UP,   /* client to broker */
	TAP_FAULT_DOWN, /* broker to client */
};
/* "both", "up", "down" as rules and records name them. */
const char *tap_fault_way_name(enum tap_fault_way w);

enum tap_fault_kill_mode {
	TAP_FAULT_KILL_RESET, /* the client's socket is reset */
	TAP_FAULT_KILL_CLOSE, /* the client gets connection.close 320 CONNECTION_FORCED, then FIN */
};

struct tap_fault_rule {
	uint32_t id; /* 1, 2, ... in the order rules were added */
	enum tap_fault_action action;
	/* connection selectors; "" or 0: any */
	char client[64];    /* the client's address: "IP" (any port) or "IP:PORT" */
	char user[128];
	char vhost[128];
	char name[128];     /* its connection_name client property */
	uint64_t conn;      /* the tap's connection id */
	/* publish selectors */
	bool has_channel;
	uint16_t channel;
	bool has_exchange, has_routing_key;
	char exchange[256];
	char routing_key[256];
	uint64_t every;     /* 0: every matching publish; N: the Nth, 2Nth, ... (counted after `after`) */
	uint64_t after;     /* the first N matching publishes of a connection pass */
	uint64_t times;     /* acts at most this often per connection; 0: no limit (kill: once) */
	double p;           /* 0: always; else the probability that an otherwise selected publish is */
	uint64_t seed;
	uint32_t for_ms;    /* 0: for ever; else active this long from when the rule was added */
	/* action parameters */
	uint32_t ms;        /* delay-confirms; latency */
	uint32_t jitter_ms; /* latency: each chunk's delay is ms +- up to this (uniform), never reordering */
	uint32_t kib;       /* bandwidth: KiB (1024 bytes) a second */
	enum tap_fault_way way; /* latency, bandwidth: dir= */
	uint32_t seconds;   /* block */
	enum tap_fault_kill_mode kill_mode;
	uint16_t close_code; /* close-channel: the reply code the client is shown (default 406) */
	char close_text[TAP_FAULT_CLOSE_TEXT_MAX + 1]; /* and its text ("" when not given: NAME - amqptap fault injection) */
	char text[256];     /* the rule as given, for logs and /api/faults */
};

/* Parses one rule ("nack:every=10"). Returns 0, or TAP_E_USAGE with a one-line message in err that names the rule
 * ("--fault 'nack:every=x': every: expected a whole number >= 1, got 'x'"). out->id is left 0. */
int tap_fault_parse(const char *spec, struct tap_fault_rule *out, char *err, size_t cap);

/* "PRECONDITION_FAILED" for 406, ...: the channel exceptions close-channel takes; NULL for any other code. */
const char *tap_fault_close_code_name(uint16_t code);

/* The rules in force and their shared state (the random generators of p=). */
struct tap_fault_set {
	struct tap_fault_rule rules[TAP_FAULT_RULES_MAX];
	int64_t added_us[TAP_FAULT_RULES_MAX];
	uint64_t rng[TAP_FAULT_RULES_MAX];
	size_t n;
	uint32_t next_id;
	uint64_t acted[TAP_FAULT_ACTIONS]; /* how often each action acted, for /metrics */
	uint64_t rule_acted[TAP_FAULT_RULES_MAX]; /* how often each rule in force acted (by index, as rules[]) */
};

void tap_fault_set_init(struct tap_fault_set *s);
/* Adds a parsed rule at now_us and gives it its id; TAP_E_FULL when TAP_FAULT_RULES_MAX are in force. */
int tap_fault_set_add(struct tap_fault_set *s, const struct tap_fault_rule *r, int64_t now_us, uint32_t *id);
/* Removes rule `id`; false when there is none. Connections forget what it had selected at their next look. */
bool tap_fault_set_remove(struct tap_fault_set *s, uint32_t id);

/* What a publish's client was shown, for its record ("client_saw"). */
enum tap_fault_saw {
	TAP_FAULT_SAW_ACK,
	TAP_FAULT_SAW_NACK,
	TAP_FAULT_SAW_NONE, /* withheld, or the connection was killed before it */
	TAP_FAULT_SAW_RETURN,          /* return: a Basic.Return 312 NO_ROUTE, then the broker's confirm */
	TAP_FAULT_SAW_ACK_THEN_RETURN, /* return-after-ack: the broker's ack, then a Basic.Return */
	TAP_FAULT_SAW_CHANNEL_CLOSED,  /* close-channel: its channel closed before any confirm of it */
};
const char *tap_fault_saw_name(enum tap_fault_saw s);

/* One time a rule acted (a `fault` record). */
struct tap_fault_act {
	uint32_t rule;
	enum tap_fault_action action;
	uint16_t channel;
	uint64_t seq;         /* the publish it acted on (its confirm sequence number; 0: not in confirm mode) */
	uint64_t outstanding; /* kill: publishes the client had sent on the channel that it saw no confirm for */
	uint32_t ms;          /* delay-confirms: how long its confirm is held; block: how long the client is not read;
	                         latency: the rule's ms */
	uint32_t jitter_ms;   /* latency */
	uint32_t kib;         /* bandwidth */
	enum tap_fault_way way; /* latency, bandwidth: the direction(s) it acts on */
	uint16_t code;        /* close-channel: the reply code the client was shown */
	const char *text;     /* and its text (borrowed for the call) */
	const char *skipped;  /* return, return-after-ack: why the client was shown nothing else after all (NULL: it
	                         was): "too_large", "no_memory", "broker_returned" */
};

/* Where the rewriter's output and news go. emit: bytes for the peer of the direction being fed (or released);
 * mark: the client is shown `saw` for publish seq of channel ch because of rule `rule` (before the tracker sees
 * the broker's confirm of it); act: a rule acted. */
struct tap_fault_io {
	void *ctx;
	void (*emit)(void *ctx, enum tap_dir dir, const uint8_t *p, size_t len);
	void (*mark)(void *ctx, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule);
	void (*act)(void *ctx, const struct tap_fault_act *a);
};

struct tap_fault_conn;

/* A connection's rewriter under the rules of set (borrowed; it outlives the connection). client: "ip:port". NULL
 * without memory (the connection is then forwarded without faults). */
struct tap_fault_conn *tap_fault_conn_new(struct tap_fault_set *set, uint64_t conn_id, const char *client);
void tap_fault_conn_free(struct tap_fault_conn *fc);

/* What tap_fault_feed and tap_fault_release ask of the relay (bits). */
enum {
	TAP_FAULT_KILL_ARMED = 1 << 0, /* a kill is under way: stop reading the client; end at TAP_FAULT_KILL_NOW or
	                                  after TAP_FAULT_KILL_WAIT_MS */
	TAP_FAULT_KILL_NOW = 1 << 1,   /* the broker confirmed the publish the kill waited for: end the session */
	TAP_FAULT_HOLDING = 1 << 2,    /* bytes are held: call tap_fault_release at tap_fault_due() */
	TAP_FAULT_FULL = 1 << 3,       /* more than TAP_FAULT_HOLD_MAX held: stop reading the broker until released */
	TAP_FAULT_BLOCKED = 1 << 4,    /* block: do not read the client; call tap_fault_unblock after
	                                  tap_fault_block_ms() */
	TAP_FAULT_CLIENT_FULL = 1 << 5, /* latency, bandwidth: more than TAP_FAULT_SHAPE_MAX client bytes held: stop
	                                   reading the client until released (TAP_FAULT_FULL says it of the broker) */
	TAP_FAULT_CLIENT_WAIT = 1 << 6, /* close-channel: the client reused a channel whose close the broker has not
	                                   answered yet: do not read the client until a feed returns without this bit */
};

/* Feeds len bytes read in direction dir at now_us; what the peer is to get is emitted through io (in order,
 * possibly in several pieces, possibly none now: the first bytes of a frame header, up to 6, wait for the rest of
 * it, so a stream that ends inside a header never passes them: no peer could read them). Returns the bits above. */
unsigned tap_fault_feed(struct tap_fault_conn *fc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t now_us,
			const struct tap_fault_io *io);
/* Emits what was held until now_us (or before). Returns the bits above. */
unsigned tap_fault_release(struct tap_fault_conn *fc, int64_t now_us, const struct tap_fault_io *io);
/* When the next held bytes are due; INT64_MAX when none are held. */
int64_t tap_fault_due(const struct tap_fault_conn *fc);
/* Bytes held for direction dir's peer (a FIN is passed on only after them). */
size_t tap_fault_held(const struct tap_fault_conn *fc, enum tap_dir dir);
/* block: how long the client is not read; then tap_fault_unblock (connection.unblocked, the client's bytes held
 * since go on). Returns the bits above. */
uint32_t tap_fault_block_ms(const struct tap_fault_conn *fc);
unsigned tap_fault_unblock(struct tap_fault_conn *fc, int64_t now_us, const struct tap_fault_io *io);
/* How a kill ends the client (the rule's mode=). */
enum tap_fault_kill_mode tap_fault_kill_mode(const struct tap_fault_conn *fc);

/* bandwidth's pacing (pure; fault_shape.c): a token bucket of `rate` bytes a second that saves up at most
 * TAP_FAULT_PACE_MS worth (at least 1 byte), full at the start. Times in microseconds, never going back. */
struct tap_fault_pace {
	uint64_t rate;   /* bytes a second; 0: not paced */
	uint64_t burst;  /* the bucket's size */
	uint64_t tokens; /* bytes that may go now */
	uint64_t frac;   /* the part of a token earned since: millionths */
	int64_t last_us; /* when tokens were last counted */
};
void tap_fault_pace_init(struct tap_fault_pace *p, uint64_t rate, int64_t now_us);
/* How many of `want` bytes may go at now_us (taken from the bucket). */
size_t tap_fault_pace_take(struct tap_fault_pace *p, int64_t now_us, size_t want);
/* The earliest time at or after now_us when min(want, burst) bytes may go. */
int64_t tap_fault_pace_when(const struct tap_fault_pace *p, int64_t now_us, size_t want);

/* The frames the rewriter makes, for tests: a basic.ack (nack: with requeue) on channel ch; returns the length
 * written into out (21 bytes). */
size_t tap_fault_confirm_frame(uint8_t out[21], uint16_t ch, bool nack, uint64_t tag, bool multiple, bool requeue);
/* connection.close 320 with text, for kill:mode=close; returns its length (at most 12 + 255 + 8). */
size_t tap_fault_close_frame(uint8_t *out, size_t cap, const char *text);
/* channel.close (class 20) or connection.close (class 10) on channel ch: code, text (at most 255 bytes), the
 * class and method that caused it; returns its length, 0 when cap is too small (12 + 255 + 8 always fits). */
size_t tap_fault_close_method(uint8_t *out, size_t cap, uint16_t cls, uint16_t ch, uint16_t code, const char *text,
			      uint16_t cause_cls, uint16_t cause_m);

#endif
