/* The consumer tracker's own declarations (consume.c, consume_record.c), private to the core. It sits beside the
 * publish tracker and shares its bottom layers: the connection it hangs from (struct tap_track_conn, its `csm`),
 * allocation counted in the tracker's memory budget (track_store.h, track_budget.h) and the render buffer and emit
 * hook (track_record.h), so its records reach the same outputs. It never calls the publish tracker's lifecycle;
 * the tracker calls it once, when a connection ends (csm_conn_end) or is freed (csm_conn_free).
 *
 *   consume.c         the events of amqptap/consume.h: consumers, unacked deliveries, settles, ends
 *   consume_record.c  the `delivery` and `consumer` records as JSON (reads state, changes none) */
#ifndef AMQPTAP_CONSUME_INT_H
#define AMQPTAP_CONSUME_INT_H

#include "amqptap/consume.h"

#include "track_int.h"

enum csm_flag {
	CSM_FLAG_REDELIVERED = 1 << 0,
	CSM_FLAG_GET = 1 << 1,
	CSM_FLAG_HAS_MESSAGE_ID = 1 << 2,
	CSM_FLAG_HAS_COUNT = 1 << 3,
	CSM_FLAG_DONE = 1 << 4,   /* its record is written: a hole in the ring until the head passes it */
	CSM_FLAG_LOST = 1 << 5,   /* no memory kept its strings */
	CSM_FLAG_NO_HEADER = 1 << 6,
	CSM_FLAG_NO_QUEUE = 1 << 7, /* a get-ok whose basic.get the tap did not see */
};

/* One delivery waiting for the client's settle. Its strings live in blob: consumer tag, queue, exchange, routing
 * key, message id (each a short string of AMQP, at most 255 bytes). */
struct csm_dlv {
	uint64_t tag;
	int64_t t_dlv;
	int64_t t_pub; /* its publish, linked by message id (csm_link_publish); 0: none */
	uint64_t body_size;
	int64_t delivery_count;
	char *blob;
	uint8_t ctag_len, queue_len, exchange_len, rk_len, mid_len;
	uint8_t flags; /* enum csm_flag */
};
/* blob NULL: no strings (all empty), or CSM_FLAG_LOST. */

/* What a delivery record is written from: a stored delivery, or one written at once. */
struct csm_view {
	const uint8_t *ctag, *queue, *exchange, *rk, *mid;
	size_t ctag_len, queue_len, exchange_len, rk_len, mid_len;
	bool has_queue, redelivered, get, has_message_id, has_count, details_lost, header_lost;
	bool props_lost; /* its content header was never read (an unfollowed channel): details_lost, strings kept */
	uint64_t tag, body_size;
	int64_t delivery_count, t_dlv;
	int64_t t_pub; /* 0: no publish linked */
};

/* Why a delivery ended unknown: by is channel_closed, connection_closed, evicted, recover, capture_gap, no_memory;
 * peer (NULL: none) who closed or how the connection ended ("client", "broker", "client_eof", ...). */
struct csm_reason {
	const char *by, *peer;
	bool has_code;
	uint16_t code;
	const uint8_t *text;
	size_t text_len;
};

/* How a delivery's record ends it. */
struct csm_outcome {
	enum tap_consume_outcome outcome;
	bool requeue, multiple;
	int64_t t_settle; /* ack, nack, reject: the client's settle */
	const struct csm_reason *reason; /* unknown: why */
};

struct csm_consumer {
	char *tag, *queue;
	uint8_t tag_len, queue_len;
	bool no_ack, exclusive;
	bool started;   /* consume-ok seen (or nowait): its consume record is written */
	bool cancelling; /* the client's basic.cancel waits for its cancel-ok */
	int64_t t_start;
	uint64_t deliveries;
};

struct csm_get {
	char *queue; /* NULL: no memory kept it */
	uint8_t queue_len;
	bool no_ack;
};

/* requeue_loop: a message seen redelivered on the channel, and how often since first. */
struct csm_redelivery {
	uint64_t key; /* hash of its message id, else of its exchange, routing key and size; 0: free */
	uint32_t n;
	int64_t t_first;
};
#define CSM_LOOP_SLOTS 4

struct csm_chan {
	uint16_t id;
	uint8_t warned; /* bit (1 << (rule - TAP_TRACK_RULE_CONSUMER_STALLED)) per consumer rule written for it */
	int64_t t_full;   /* when its unacked deliveries last reached the prefetch */
	int64_t t_settle; /* the client's last settle on it */
	struct csm_redelivery loop[CSM_LOOP_SLOTS];
	uint16_t prefetch;
	bool qos_seen, global;
	/* unacked deliveries, sorted by tag (the broker numbers them up from 1 on each channel): [head, len) of dlv */
	struct csm_dlv *dlv;
	uint32_t cap, head, len, live;
	struct csm_consumer *cons;
	uint32_t n_cons, cap_cons;
	uint32_t n_cons_started; /* of which started (consume-ok seen) */
	struct csm_get gets[TAP_CONSUME_GETS_MAX]; /* basic.get sent, get-ok or get-empty to come, oldest first */
	uint8_t gets_head, gets_len;
};

struct csm_conn {
	struct csm_chan **chans; /* sorted by id */
	uint32_t n_chans, cap_chans;
	uint64_t unacked;
};
#define CSM_CHANS_MIN 4u /* the first capacity of chans, doubled when full */

/* Publish -> delivery links: a direct-mapped table of the recent publishes' identities (csm_link_key: the message
 * id's, else a fingerprint of exchange, routing key, properties and body) and when each was published, made at the
 * process's first consumer method (a tap that sees no consumer keeps none and spends nothing per publish on it). A
 * delivery with the same identity is linked (queue_us, end_to_end_us); every queue a fan-out reaches finds the same
 * entry. An identity that collides with a newer one is forgotten; two identical messages are one identity (the
 * later publish wins). */
#define CSM_LINKS 65536u
struct csm_link {
	uint64_t key;
	int64_t t_pub;
};

/* ---- consume.c: the tracker's calls ---- */

/* The key a publish and its deliveries are linked by: their identity (amqptap/identity.h: its message_id's, or a
 * fingerprint), else (--identity off) the identity of its message_id; 0: none. */
uint64_t csm_link_key(uint8_t identity_kind, uint64_t identity, bool has_message_id, struct tap_slice message_id);
/* A publish with this key (not 0) was forwarded at now_us (t->csm_links is set). */
void csm_link_publish(struct tap_track *t, uint64_t key, int64_t now_us);

/* The connection ends: every unacked delivery is written unknown (connection_closed, r says how), every consumer
 * ends; then its state is freed. */
void csm_conn_end(struct tap_track_conn *c, const struct trk_reason *r, int64_t now_us);
/* Frees what the connection keeps, writing nothing (tap_track_free). */
void csm_conn_free(struct tap_track_conn *c);

/* The consumer rules that run out with time (consumer_stalled, unacked_near_timeout) of every connection at now_us;
 * returns when the next may (INT64_MAX: none). tap_track_tick calls it once t->csm_due has come. */
int64_t csm_tick(struct tap_track *t, int64_t now_us);

/* ---- consume_record.c ---- */

/* What a consumer warning names besides its rule: a delivery (v), or a consumer (ctag, queue), and up to two
 * numbers (key NULL: none). */
struct csm_warn {
	const struct csm_view *v;
	bool has_consumer;
	struct tap_slice ctag, queue;
	const char *k1, *k2;
	int64_t v1, v2;
};
void csm_record_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                        const struct csm_warn *w, int64_t now_us);

void csm_record_delivery(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                         const struct csm_view *v, const struct csm_outcome *o, int64_t now_us);
/* A consumer started (event "consume") or ended ("cancel": by names who ended it). */
void csm_record_consumer(struct trk_render *r, const struct tap_track_conn *c, const struct csm_chan *ch,
                         const struct csm_consumer *k, const char *event, const char *by, int64_t now_us);
void csm_view_of(struct csm_view *v, const struct csm_dlv *d);

#endif
