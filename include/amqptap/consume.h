/* The consumer tracker: beside the publish tracker (amqptap/track.h), on the same connections, fed with the consumer
 * side of the protocol (basic.qos, consume, cancel, deliver, get, the client's ack/nack/reject, recover, channel and
 * connection ends) and writing exactly one `delivery` record per delivered message and a `consumer` record when a
 * consumer starts and when it ends (src/DESIGN.md §4), through the tracker's emit hook. Pure core: never reads the
 * clock; every call takes now_us. Delivery tags are per channel (0-9-1 §1.8.3.14): an ack with `multiple` settles
 * every delivery of the channel up to its tag, whatever consumer it went to. */
#ifndef AMQPTAP_CONSUME_H
#define AMQPTAP_CONSUME_H

#include "amqptap/dir.h"
#include "amqptap/props.h" /* struct tap_slice */
#include "amqptap/track.h"

#include <stdbool.h>
#include <stdint.h>

/* Unacked deliveries a channel keeps when it set no prefetch (basic.qos 0, or none): past it the oldest is written
 * unknown, reason evicted. With a prefetch the bound is prefetch per consumer (the broker keeps to it) plus this
 * many for basic.get, which no prefetch limits. */
#define TAP_CONSUME_UNACKED_CAP 65536u
#define TAP_CONSUME_GET_SLACK 1024u
/* Consumers one channel keeps; basic.get requests waiting for their answer. */
#define TAP_CONSUME_CONSUMERS_MAX 4096u
#define TAP_CONSUME_GETS_MAX 8u
/* requeue_loop: one message (its message id, else its exchange, routing key and size) delivered redelivered this
 * many times on a channel within this long. */
#define TAP_CONSUME_LOOP_REDELIVERIES 20u
#define TAP_CONSUME_LOOP_WINDOW_US 60000000

/* A basic.deliver or basic.get-ok with its content header (the record is written from this). Slices are valid only
 * during the call. */
struct tap_delivery {
	struct tap_slice consumer_tag, exchange, routing_key, message_id;
	bool get;              /* basic.get-ok, not basic.deliver */
	bool redelivered;
	bool has_message_id;
	bool has_delivery_count; /* the header table's x-delivery-count (quorum queues) */
	int64_t delivery_count;
	uint64_t delivery_tag, body_size;
	bool details_lost; /* no memory kept its strings */
	bool content_cut;  /* the connection ended before its content did: the client never had it */
	bool header_lost;  /* content_cut before the content header: body_size and properties not known */
	/* its channel had no decoder state (past --max-tracking-memory): handed over at its method, its content not
	 * read (header_lost too); written at once, unknown/no_memory unless its consumer is known to be no_ack */
	bool unfollowed;
	/* its identity as a publish's is made (amqptap/identity.h, --identity): the same as its publish's, by which the
	 * tracker links the two; 0: none */
	uint8_t identity_kind;
	uint64_t identity;
};

/* How a client settles deliveries. */
enum tap_consume_settle {
	TAP_CONSUME_ACK,
	TAP_CONSUME_NACK,
	TAP_CONSUME_REJECT,
};

/* The outcome a delivery record writes. */
enum tap_consume_outcome {
	TAP_CONSUME_OUT_ACK,
	TAP_CONSUME_OUT_NACK,
	TAP_CONSUME_OUT_REJECT,
	TAP_CONSUME_OUT_AUTO_ACK,
	TAP_CONSUME_OUT_UNKNOWN,
	TAP_CONSUME_N_OUTCOMES,
};
const char *tap_consume_outcome_name(enum tap_consume_outcome o);

void tap_consume_qos(struct tap_track_conn *c, uint16_t ch, uint16_t prefetch, bool global, int64_t now_us);
/* basic.consume from the client; without nowait the consumer starts at its consume-ok (which names the tag the
 * broker chose for an empty one). */
void tap_consume_consume(struct tap_track_conn *c, uint16_t ch, struct tap_slice tag, struct tap_slice queue,
                         bool no_ack, bool exclusive, bool nowait, int64_t now_us);
void tap_consume_consume_ok(struct tap_track_conn *c, uint16_t ch, struct tap_slice tag, int64_t now_us);
/* basic.cancel: the client's (the consumer ends at its cancel-ok, or at once with nowait) or the broker's (the
 * queue was deleted: consumer_cancel_notify). */
void tap_consume_cancel(struct tap_track_conn *c, uint16_t ch, struct tap_slice tag, enum tap_peer by, bool nowait,
                        int64_t now_us);
void tap_consume_cancel_ok(struct tap_track_conn *c, uint16_t ch, struct tap_slice tag, int64_t now_us);
void tap_consume_get(struct tap_track_conn *c, uint16_t ch, struct tap_slice queue, bool no_ack, int64_t now_us);
void tap_consume_get_empty(struct tap_track_conn *c, uint16_t ch, int64_t now_us);
/* A delivery whose content was forwarded whole to the client at now_us (or cut: written at once, unknown). */
void tap_consume_deliver(struct tap_track_conn *c, uint16_t ch, const struct tap_delivery *d, int64_t now_us);
/* The client's basic.ack / basic.nack / basic.reject (multiple: every delivery of the channel up to tag; tag 0 with
 * multiple: all of them). */
void tap_consume_settle(struct tap_track_conn *c, uint16_t ch, enum tap_consume_settle how, uint64_t tag,
                        bool multiple, bool requeue, int64_t now_us);
/* basic.recover / recover-async: every unacked delivery of the channel goes back to the queue. */
void tap_consume_recover(struct tap_track_conn *c, uint16_t ch, bool requeue, int64_t now_us);
/* channel.close from either side (the first one counts), or channel.open on a number still known: every unacked
 * delivery is written unknown (reason channel_closed: the broker requeues them) and its consumers end. */
void tap_consume_channel_close(struct tap_track_conn *c, uint16_t ch, enum tap_peer by, uint16_t code,
                               struct tap_slice text, int64_t now_us);
/* The capture lost bytes of the connection: a settle or a delivery may have been among them; every unacked
 * delivery is written unknown (capture_gap). */
void tap_consume_conn_gap(struct tap_track_conn *c, int64_t now_us);

struct tap_consume_stats {
	uint64_t deliveries;       /* tap_consume_deliver calls */
	uint64_t delivery_records; /* equals deliveries once nothing is unacked */
	uint64_t by_outcome[TAP_CONSUME_N_OUTCOMES];
	uint64_t requeued;   /* nack/reject with requeue */
	uint64_t redelivered; /* deliveries with the redelivered flag */
	uint64_t evicted;
	uint64_t unacked;    /* deliveries waiting for the client's settle now */
	uint64_t consumers_open, consumers_total;
	uint64_t stray_settles; /* the client settled a tag the tap does not know as unacked */
	uint64_t unfollowed; /* written at once: no memory for their channel's state (decoder's or tracker's) */
};
void tap_consume_get_stats(const struct tap_track *t, struct tap_consume_stats *s);
/* One consumer (its consume-ok seen) of a live connection, for the status page. unacked counts the deliveries it
 * got that the client has not settled; oldest_us is when the oldest of them was delivered (0: none); both only when
 * unacked_known (see tap_consume_each_consumer). The strings are borrowed for the call. */
struct tap_consume_consumer_info {
	uint64_t conn;
	uint16_t channel;
	struct tap_slice tag, queue; /* queue ptr NULL: no memory kept it */
	bool no_ack;
	uint16_t prefetch; /* the channel's basic.qos (0: none seen, or no limit) */
	bool global_qos;
	uint64_t deliveries, unacked;
	bool unacked_known;
	int64_t oldest_us, since_us;
};
typedef void (*tap_consume_consumer_fn)(void *ctx, const struct tap_consume_consumer_info *info);
/* Calls fn for at most max consumers, connections newest first, and returns how many consumers there are. A
 * consumer's unacked deliveries are counted in a pass over its channel's unacked ones; the passes of one call look
 * at most scan_max deliveries in all (the loop renders the status page: many consumers on a channel holding many
 * unacked must not hold forwarding up), and a consumer past that has unacked_known false. */
uint64_t tap_consume_each_consumer(const struct tap_track *t, size_t max, uint64_t scan_max, tap_consume_consumer_fn fn,
                                   void *ctx);
/* fn (NULL: none) is called once per `delivery` record, right after it is emitted, with its queue (ptr NULL: not
 * known) and outcome. */
typedef void (*tap_consume_delivery_fn)(void *ctx, struct tap_slice queue, enum tap_consume_outcome outcome);
void tap_consume_set_delivery_hook(struct tap_track *t, tap_consume_delivery_fn fn, void *ctx);
/* Settle latency (deliver -> the client's ack/nack/reject) of the process, µs. */
const struct tap_hist *tap_consume_settle_hist(const struct tap_track *t);
/* Queue time (its publish forwarded -> the delivery forwarded: queue_us) of the linked deliveries, µs. */
const struct tap_hist *tap_consume_queue_hist(const struct tap_track *t);

#endif
