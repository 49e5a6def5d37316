/* Small helpers shared by the rabbitmq-c test clients and load generators: a clock, RPC replies and the
 * publisher-confirm bookkeeping. Include after <amqp.h> and <amqp_framing.h>. */
#ifndef TAP_RMQ_UTIL_H
#define TAP_RMQ_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* Monotonic microseconds, for latencies. */
static inline uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* NULL for a normal reply, else a short reason. */
static inline const char *rpc_error(amqp_rpc_reply_t r)
{
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return NULL;
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		return amqp_error_string2(r.library_error);
	return "broker closed the channel or connection";
}

/* Publisher-confirm bookkeeping on one confirm channel (src/PROTOCOL.md §8): which of the publish sequence numbers
 * 1..sent the broker has confirmed, and how one basic.ack or basic.nack settles them (multiple=1: every outstanding
 * seq up to its delivery tag). The caller counts its publishes in sent. */
struct rmq_confirms {
	uint64_t sent;          /* seqs 1..sent have been published */
	uint64_t confirmed;     /* acked + nacked: each seq is settled once */
	uint64_t acked, nacked;
	uint64_t lowest;        /* the lowest seq not confirmed yet */
	uint8_t *done;          /* [1..capacity]: done[seq] once seq is confirmed */
};

/* Called for each seq a confirm settles, once per seq. */
typedef void (*rmq_confirm_fn)(void *arg, uint64_t seq, bool nack);

enum rmq_confirm_kind { RMQ_NOT_A_CONFIRM, RMQ_ACK, RMQ_NACK };

/* One basic.ack or basic.nack as it came. */
struct rmq_confirm {
	enum rmq_confirm_kind kind;
	uint64_t tag;
	bool multiple;
};

/* For up to capacity publishes; false when out of memory. Freed by rmq_confirms_deinit(). */
static inline bool rmq_confirms_init(struct rmq_confirms *c, uint64_t capacity)
{
	*c = (struct rmq_confirms){.lowest = 1, .done = calloc(capacity + 1, 1)};
	return c->done != NULL;
}

static inline void rmq_confirms_deinit(struct rmq_confirms *c)
{
	free(c->done);
	c->done = NULL;
}

/* The confirm f carries: kind RMQ_NOT_A_CONFIRM for any other frame. */
static inline struct rmq_confirm rmq_confirm_of(const amqp_frame_t *f)
{
	struct rmq_confirm k = {RMQ_NOT_A_CONFIRM, 0, false};
	if (f->frame_type != AMQP_FRAME_METHOD)
		return k;
	if (f->payload.method.id == AMQP_BASIC_ACK_METHOD) {
		const amqp_basic_ack_t *a = f->payload.method.decoded;
		k = (struct rmq_confirm){RMQ_ACK, a->delivery_tag, a->multiple};
	} else if (f->payload.method.id == AMQP_BASIC_NACK_METHOD) {
		const amqp_basic_nack_t *n = f->payload.method.decoded;
		k = (struct rmq_confirm){RMQ_NACK, n->delivery_tag, n->multiple};
	}
	return k;
}

/* Settles seq if it is outstanding (published, not confirmed yet), calling on_seq (may be NULL); returns whether
 * it was. */
static inline bool rmq_confirm_seq(struct rmq_confirms *c, uint64_t seq, bool nack, rmq_confirm_fn on_seq, void *arg)
{
	if (seq < 1 || seq > c->sent || c->done[seq])
		return false;
	c->done[seq] = 1;
	c->confirmed++;
	if (nack)
		c->nacked++;
	else
		c->acked++;
	if (on_seq)
		on_seq(arg, seq, nack);
	while (c->lowest <= c->sent && c->done[c->lowest])
		c->lowest++;
	return true;
}

/* Applies one ack or nack: its tag alone, or with multiple every outstanding seq <= tag. Returns how many seqs it
 * settled (a repeated or unknown tag settles none). */
static inline uint64_t rmq_confirm_apply(struct rmq_confirms *c, struct rmq_confirm k, rmq_confirm_fn on_seq,
					 void *arg)
{
	bool nack = k.kind == RMQ_NACK;
	if (!k.multiple)
		return rmq_confirm_seq(c, k.tag, nack, on_seq, arg);
	uint64_t settled = 0;
	for (uint64_t q = c->lowest; q <= k.tag && q <= c->sent; q++)
		settled += rmq_confirm_seq(c, q, nack, on_seq, arg);
	return settled;
}

#endif
