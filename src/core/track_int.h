/* The tracker's own types, shared by its parts: track.c (the publish lifecycle: events in, one verdict per publish
 * out, and the memory budget), track_conn.c (connections and channels open and close), track_store.c (where
 * outstanding publishes live: channels, slot rings, arenas, queues, and the bytes they cost) and track_record.c
 * (the records of DESIGN §4 as JSON: reads state, changes none). */
#ifndef AMQPTAP_TRACK_INT_H
#define AMQPTAP_TRACK_INT_H

#include "amqptap/json.h"
#include "amqptap/track.h"

#include "arena.h"
#include "heap.h"
#include "intern.h"
#include "mem.h"

/* What the connection's intern table holds, by tag. */
enum trk_tag {
	TRK_TAG_ROUTE = 0, /* exchange, routing key */
	TRK_TAG_TEXT = 1,  /* a Return's reply text */
	TRK_TAG_EXTRA = 2, /* the pre-rendered optional members of a publish record */
};

/* The life of an outstanding publish (a slot). Every arrow that ends in DONE is decided by verdict_of() in
 * track.c and writes the one `publish` record (route/confirm, order when both a Return and a confirm exist):
 *
 *   publish, nothing to wait for (late-return hold 0) ------------------------> DONE unproven/none
 *   publish, plain (no confirm, not mandatory) --> WAIT (PLAIN: held for a publish-caused close)
 *   WAIT, PLAIN --hold over, settled, or end----------------> DONE unproven/none
 *   WAIT, PLAIN --the broker's publish-caused close names it or an earlier one--> WAIT (REFUSED)
 *   publish, confirm mode or mandatory or channel closing --> WAIT
 *   WAIT --ack, mandatory, no Return yet---------------------> HELD (a late Return may still come, PROTOCOL §9)
 *   WAIT --ack/nack, not mandatory---------------------------> DONE unproven/ack|nack
 *   WAIT --ack/nack, Return seen-----------------------------> DONE returned/ack|nack, return_before_ack
 *   WAIT --Return, confirm mode------------------------------> WAIT (+ RETURNED; the ack follows)
 *   WAIT --Return, no confirm--------------------------------> DONE returned/none
 *   WAIT --return window over (no confirm)-------------------> DONE unproven/none
 *   WAIT --end, settled (no confirm)-------------------------> DONE unproven/none
 *   WAIT, TX --tx.commit-ok, no Return-----------------------> DONE routed/none if mandatory, else unproven/none
 *   WAIT, TX --tx.rollback-ok, or any end--------------------> DONE unknown/none + reason (tx_rollback, the close)
 *   WAIT --end (close, eof, eviction, shutdown, no memory)---> DONE unknown/unknown|none + reason
 *                                                              (REFUSED: unknown/none + the broker's close)
 *                                                              (returned/unknown|none when a Return was seen)
 *   HELD --late Return---------------------------------------> DONE returned/ack, ack_before_return
 *   HELD --hold over, or end---------------------------------> DONE routed/ack
 *
 * AMBIGUOUS (a Return matched it and others alike): where the arrows above say routed or unproven, the record
 * says unknown (reason ambiguous_return): the tap cannot tell whether this was the publish that came back.
 *
 * "settled": the broker answered everything before this end (close-ok to the client's close, tx.commit-ok). */
enum trk_state {
	TRK_STATE_DONE = 0,
	TRK_STATE_WAIT = 1,
	TRK_STATE_HELD = 2,
};

/* What happens to a slot; the input of verdict_of(). */
enum trk_event {
	TRK_EVENT_ACK,
	TRK_EVENT_NACK,
	TRK_EVENT_RETURN,    /* a Return was paired with it (RETURNED, t_ret and reply already set) */
	TRK_EVENT_TIMEOUT,   /* its return window or its late-return hold is over */
	TRK_EVENT_END,       /* its channel or connection ended, or it is evicted: a reason says why */
	TRK_EVENT_UNTRACKED, /* nothing to wait for: written at once */
	TRK_EVENT_GAP,       /* the capture lost bytes of its connection (replay, sniff): a reason says so */
	TRK_EVENT_COMMIT,    /* tx.commit-ok for its transaction: the broker sent every Return of it before */
};

enum trk_flag {
	TRK_FLAG_MANDATORY = 1 << 0,
	TRK_FLAG_CONFIRM = 1 << 1,
	TRK_FLAG_TX = 1 << 2,
	TRK_FLAG_HAS_MESSAGE_ID = 1 << 3,
	TRK_FLAG_HAS_CORRELATION_ID = 1 << 4,
	TRK_FLAG_HAS_DELIVERY_MODE = 1 << 5,
	TRK_FLAG_RETURNED = 1 << 6,
	TRK_FLAG_MULTIPLE = 1 << 7,
	TRK_FLAG_NO_BLOB = 1 << 8, /* its strings could not be stored */
	TRK_FLAG_HAS_TIMESTAMP = 1 << 9,
	TRK_FLAG_BLOCKED = 1 << 10,  /* published while the broker had the connection blocked */
	TRK_FLAG_SEQ_LOST = 1 << 11, /* published after a client-side capture gap: its confirm sequence number is not known */
	TRK_FLAG_PLAIN = 1 << 12,    /* neither confirm nor mandatory: held only for a publish-caused close */
	TRK_FLAG_REFUSED = 1 << 13,  /* the culprit of a publish-caused close, or sent after it on its channel */
	TRK_FLAG_CULPRIT = 1 << 14,  /* the publish the broker's close names */
	TRK_FLAG_REFUSABLE = 1 << 15, /* what RabbitMQ refuses whatever the route: immediate, or a user_id not the login's */
	TRK_FLAG_CUT = 1 << 16,       /* its content never finished: the broker never had the whole message */
	TRK_FLAG_AMBIGUOUS = 1 << 17, /* a Return may have been its: it and others matched one that had no way to
	                                 tell them apart (no or the same message_id) */
	TRK_FLAG_NO_HEADER = 1 << 18, /* cut before its content header: its size and properties are not known */
};

/* How the broker's publish-caused close (if any) on a channel pointed at the publish it refused. */
enum trk_refusal {
	TRK_REFUSAL_NONE = 0,
	TRK_REFUSAL_NAMED,   /* one publish is the culprit: ch->culprit */
	TRK_REFUSAL_UNNAMED, /* the close text points at none: every publish then waiting is a candidate */
};

/* One outstanding publish (64 bytes). Its blob in the channel arena: [timestamp, 8 bytes, when present] then
 * message_id then correlation_id. Repeating strings are interned per connection. */
struct trk_slot {
	int64_t t_pub, t_ret, t_ack;
	uint64_t body_size;
	uint64_t blob;
	uint32_t route_key;  /* TRK_TAG_ROUTE id */
	uint32_t reply_text; /* TRK_TAG_TEXT id, when RETURNED */
	uint32_t extra;      /* TRK_TAG_EXTRA id, or TAP_INTERN_NONE */
	uint32_t flags;      /* enum trk_flag */
	uint16_t reply_code;
	uint8_t message_id_len, correlation_id_len;
	uint8_t state;       /* enum trk_state */
	uint8_t delivery_mode;
};
_Static_assert(sizeof(struct trk_slot) == 64, "keep outstanding publishes compact");

/* In a tx_q entry: the transaction was rolled back, not committed. */
#define TRK_TX_ROLLBACK (UINT64_C(1) << 63)

/* A queue of slot numbers; cap is a power of two. */
struct trk_fifo {
	uint64_t *v;
	uint32_t cap, head, len;
};

enum trk_mode {
	TRK_MODE_NONE = 0,
	TRK_MODE_CONFIRM = 1,
	TRK_MODE_TX = 2,
	TRK_MODE_UNKNOWN = 3, /* the capture may have missed its confirm.select or tx.select (tap_track_conn_unseen) */
};

struct trk_reason {
	const char *by; /* "broker", "client", "eof", ...; NULL: none */
	bool settled;
	bool has_code;
	uint16_t code;
	const uint8_t *text;
	size_t text_len;
};

/* What the warning rules (track_warn.c) keep per channel. */
struct trk_warn_chan {
	uint16_t warned;       /* bit (1 << enum tap_track_rule) per rule already written for the channel */
	uint32_t waited_run;   /* consecutive publishes made after the confirm of the one before */
	bool pipelined;        /* a publish was made while another awaited its confirm: the rule never fires */
	uint64_t publishes;    /* since the channel was opened */
	uint64_t confirm_publishes, unanswered; /* confirm-mode publishes, of which not yet acked, nacked or ended */
	int64_t t_answer;      /* the last ack or nack */
};

struct trk_chan {
	uint16_t id;
	uint8_t mode; /* enum trk_mode */
	bool closing, close_by_broker, warned_confirm_without_mandatory, warned_ack_before_return;
	bool pinned;         /* slots are being stored or released in a loop: the ring and arena keep their place */
	bool shrink_pending; /* slots were released while pinned */
	uint16_t close_code;
	char *close_text;
	size_t close_text_len;
	uint64_t sel_off; /* slot n of confirm seq s is s + sel_off */
	/* ring of slots [base, next): slot n at ring[n & (cap - 1)]; the slot at base is always live */
	struct trk_slot *ring;
	uint64_t cap, base, next;
	uint64_t live;
	struct tap_arena arena;
	struct trk_fifo held_q; /* slots acked and held, in ack order */
	struct trk_fifo win_q;  /* non-confirm mandatory slots, in publish order */
	struct trk_fifo plain_q; /* PLAIN slots, in publish order: held conf.late_return_us */
	struct trk_fifo tx_q;    /* tx.commit / tx.rollback sent and not answered: the slot number each ends its
	                            transaction before (TRK_TX_ROLLBACK set for a rollback), oldest first */
	uint8_t refusal;         /* enum trk_refusal */
	char *culprit;           /* the JSON object naming the publish that made the broker close it, or NULL */
	size_t culprit_len;
	int32_t active_idx;     /* index in conn->active or -1 */
	uint32_t oldest_idx;    /* place in t->oldest + 1, 0: not in it */
	struct tap_track_conn *conn;
	struct trk_warn_chan warn;
};

struct trk_counts {
	uint64_t publishes, routed, returned, unproven, unknown, acked, nacked;
};

struct tap_track_conn {
	struct tap_track *t;
	struct tap_track_conn *prev, *next;
	uint64_t id;
	char *client, *upstream, *user, *vhost, *product, *version, *platform;
	char *upstream_local; /* proxy: the tap's own end of its connection to the broker (the client the broker sees) */
	bool proxied;         /* upstream_local was given (NULL then: no memory kept it) */
	uint16_t channel_max, heartbeat;
	uint32_t frame_max;
	bool tuned, opened, blocked;
	int64_t blocked_since, t_new;
	/* the last connection.unblocked: while the broker had the connection blocked it read nothing of it, so no
	 * return window or plain hold runs then; one started before it runs again from there */
	int64_t unblocked_at;
	/* the same for the tap itself not reading the broker (tap_track_conn_held): no window runs out while held,
	 * and every one, acked or not, runs again from the end of the hold */
	bool held;
	int64_t unheld_at;
	bool closed, close_by_broker;
	bool settled;     /* the broker's close-ok answered the client's connection.close */
	char *end_detail; /* why the TCP/TLS connection failed, when no close method says it */
	uint16_t close_code;
	char *close_text;
	size_t close_text_len;
	struct trk_chan **chans; /* sorted by id: a connection has a few, usually one */
	/* a channel the client opened again before the broker was done with it (tap_track_channel_open): out of
	 * chans, still answered by the broker, until its close-ok or the open-ok of its successor */
	struct trk_chan *retired;
	uint32_t n_chans, cap_chans;
	struct trk_chan **active; /* channels with outstanding publishes */
	uint32_t n_active, cap_active;
	uint64_t outstanding;
	struct tap_intern keys;
	struct trk_counts counts;
	struct tap_hist *hist; /* allocated at confirm.select: most of a connection's memory otherwise */
	struct tap_buf prefix; /* "conn":..,"client":..,"vhost":..,"user":.. of its publish records */
	size_t prefix_cost;    /* what prefix is counted as in the budget */
	uint32_t one_publish_channels; /* closed after exactly one publish (channel_churn) */
	bool warned_churn;
	struct trk_ids *ids; /* the recent message ids (duplicate_message_id); NULL until the first */
	const char *unseen_by; /* set by tap_track_conn_unseen: a channel first seen at a publish has an unknown mode */
	bool chans_lost;       /* a channel's open or mode was seen without memory to store it: the same for them */
	bool details_lost;     /* a string of its records (client, user, product, close text...) not kept: null */
	bool prefix_lost;      /* of which client, vhost or user: its publish records say details_lost too */
	int64_t next_due;      /* no timer of its channels is due before this: tap_track_tick skips it until then */
	uint32_t due_idx;      /* place in t->due + 1, 0: not in it (next_due is INT64_MAX) */
};

/* The record being written and the second whose date part is formatted (records are written in time order,
 * a few per second share it). Only track_record.c writes these. */
struct trk_render {
	struct tap_buf rec;
	int64_t ts_sec; /* second of ts_str, INT64_MIN: none */
	char ts_str[32];
	char run[TAP_TRACK_RUN_MAX + 1];       /* "": no identity members */
	char run_json[TAP_JSON_ESCAPED_MAX(TAP_TRACK_RUN_MAX)]; /* run, quoted */
	size_t run_json_len;
	char tap_id[TAP_TRACK_TAP_ID_MAX + 1];
	int64_t started_us;
};

struct tap_track {
	struct tap_track_conf conf;
	tap_track_emit_fn emit;
	void *ctx;
	tap_track_verdict_fn verdict_hook;
	void *verdict_ctx;
	tap_track_conn_event_fn conn_hook;
	void *conn_ctx;
	struct tap_track_conn *conns;
	struct trk_render render;
	struct tap_buf extra; /* the optional members of the publish being stored */
	struct tap_track_stats st;
	struct trk_counts closed_counts; /* of connections already ended */
	struct tap_hist hist;
	/* every channel with outstanding publishes, keyed by the t_pub of its base slot: the oldest outstanding publish
	 * of the process is the base of the top one */
	struct tap_heap oldest;
	/* every connection with a timer running, keyed by next_due: tap_track_tick looks at the due ones only */
	struct tap_heap due;
	uint64_t mem;  /* bytes counted against conf.max_memory */
	bool squeeze;  /* making room: unreferenced strings are freed, not cached */
};

/* What a publish record is written from: a stored slot or the caller's tap_publish. */
struct trk_view {
	const uint8_t *exchange, *routing_key, *message_id, *correlation_id, *extra;
	size_t exchange_len, routing_key_len, message_id_len, correlation_id_len, extra_len;
	bool mandatory, has_message_id, has_correlation_id, has_delivery_mode, has_timestamp, confirm_mode, tx, blocked;
	bool refused, culprit; /* REFUSED, CULPRIT */
	bool route_lost;       /* no memory kept its exchange and routing key: written null */
	bool details_lost;     /* route_lost, or no memory kept its message id, correlation id or timestamp */
	bool refused_unnamed;  /* REFUSED on a channel whose close named no culprit */
	bool header_lost;      /* NO_HEADER: body_size written null */
	uint8_t delivery_mode;
	uint64_t body_size, seq, timestamp;
	int64_t t_pub;
};

/* What verdict_of() decided. */
struct trk_verdict {
	enum tap_track_route route;
	enum tap_track_confirm confirm;
	enum tap_track_order order;
	bool multiple;
	int64_t t_ack, t_ret; /* valid for ack/nack, returned */
	uint16_t reply_code;
	const uint8_t *reply_text;
	size_t reply_text_len;
	const struct trk_reason *reason; /* NULL: none */
};

/* The most tracking memory so far: the peak noted where memory grows (a publish stored, a connection's prefix, a
 * channel), or the memory now if it grew since where no peak is noted (intern tables, heaps). */
static inline uint64_t trk_memory_peak(const struct tap_track *t)
{
	return t->mem > t->st.memory_peak ? t->mem : t->st.memory_peak;
}

static inline void trk_note_peak(struct tap_track *t)
{
	t->st.memory_peak = trk_memory_peak(t);
}

static inline struct trk_slot *trk_slot(const struct trk_chan *ch, uint64_t n)
{
	return &ch->ring[n & (ch->cap - 1)];
}

static inline void trk_counts_add(struct trk_counts *sum, const struct trk_counts *k)
{
	sum->publishes += k->publishes;
	sum->routed += k->routed;
	sum->returned += k->returned;
	sum->unproven += k->unproven;
	sum->unknown += k->unknown;
	sum->acked += k->acked;
	sum->nacked += k->nacked;
}

/* ---- track.c: the lifecycle ---- */

/* Counts the record in t->render and hands it to the emit callback. */
void trk_emit(struct tap_track *t);
/* Applies ev to outstanding slot n: it waits on, is held, or its record is written (stamped stamp_us) and it is
 * released. */
void trk_slot_step(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n, enum trk_event ev,
                   const struct trk_reason *why, int64_t stamp_us);
/* Evicts the oldest outstanding publishes of the process until need more bytes fit in conf.max_memory, or
 * nothing is left to evict. */
void trk_make_room(struct tap_track *t, uint64_t need, int64_t now_us);
/* Zeroed and counted, room made first; NULL when out of memory. */
void *trk_alloc_in_budget(struct tap_track *t, size_t n, int64_t now_us);

/* ---- track_conn.c ---- */

/* The channel, created (room made first) when new; NULL when out of memory. */
struct trk_chan *trk_chan_in_budget(struct tap_track_conn *c, uint16_t id, int64_t now_us);
/* ch was just created by a publish: after tap_track_conn_unseen its mode is unknown. */
void trk_chan_first_publish(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us);

/* ---- track_store.c ---- */

struct trk_chan *trk_chan_find(const struct tap_track_conn *c, uint16_t id);
/* The channel the broker's answers on `id` are for: a retired one first (its answers come before the broker
 * takes the new open), else trk_chan_find's. */
struct trk_chan *trk_chan_answering(const struct tap_track_conn *c, uint16_t id);
/* Takes ch out of chans and keeps it as c->retired (the one before must be gone). */
void trk_chan_retire(struct tap_track_conn *c, struct trk_chan *ch);
/* The channel, created when new (NULL when out of memory). */
struct trk_chan *trk_chan_get(struct tap_track_conn *c, uint16_t id);
void trk_chan_free(struct tap_track_conn *c, struct trk_chan *ch);
/* Rings this small (and arenas of TAP_ARENA_MIN_CAP) stay when their channel empties: a publish-and-wait client
 * allocates nothing. */
#define TRK_RING_MIN_CAP 16u

/* Bytes growing the ring by one slot would allocate: 0 when a slot is free. */
static inline uint64_t trk_ring_growth(const struct trk_chan *ch)
{
	if (ch->next - ch->base < ch->cap)
		return 0;
	return tap_mem_cost((ch->cap ? ch->cap * 2 : TRK_RING_MIN_CAP) * sizeof *ch->ring);
}
bool trk_ring_reserve(struct tap_track_conn *c, struct trk_chan *ch);
bool trk_fifo_push(struct tap_track *t, struct trk_fifo *f, uint64_t v);
uint64_t trk_fifo_front(const struct trk_fifo *f);
void trk_fifo_pop(struct trk_fifo *f);
/* A slot was stored at n (the ring's new tail): count it, put its channel on the active list. */
void trk_slot_stored(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n);
/* The slot's record has been written (or is being dropped): release what it holds, move the head, give memory
 * back (unless pinned) when the channel empties or its ring and arena are mostly unused. */
void trk_slot_release(struct tap_track_conn *c, struct trk_chan *ch, uint64_t n);
/* Gives memory back when the channel is empty or its ring or arena is a quarter used. */
void trk_chan_shrink(struct tap_track *t, struct trk_chan *ch);

/* Ends a pinned stretch: gives back what the releases in it would have. */
static inline void trk_chan_unpin(struct tap_track *t, struct trk_chan *ch)
{
	ch->pinned = false;
	if (ch->shrink_pending) {
		ch->shrink_pending = false;
		trk_chan_shrink(t, ch);
	}
}
/* The channel whose base slot is the oldest outstanding publish of the process, or NULL. */
struct trk_chan *trk_oldest_chan(const struct tap_track *t);
void trk_view_of_slot(struct trk_view *v, const struct tap_track_conn *c, const struct trk_chan *ch, uint64_t n);
/* Allocations counted in t->mem. */
void *trk_alloc(struct tap_track *t, size_t n);
void trk_free(struct tap_track *t, void *p, size_t n);
/* len bytes and a NUL (free with trk_free(t, p, len + 1)); NULL when out of memory. */
char *trk_dup(struct tap_track *t, const uint8_t *s, size_t len);
/* C strings (printed up to their first NUL: they are kept up to it). */
/* Copies s into *dst (the old value freed); false, *dst NULL and a shortage counted when there was no memory. */
bool trk_set_str(struct tap_track *t, char **dst, struct tap_slice s);
bool trk_set_cstr(struct tap_track *t, char **dst, const char *s); /* s NULL: *dst NULL, true */
void trk_free_str(struct tap_track *t, char **s);

/* ---- track_warn.c: the publisher anti-patterns (DESIGN §4) ---- */

/* Writes the `warning` record of rule (seq 0: none) and counts it. */
void trk_warn(struct tap_track_conn *c, uint16_t ch, enum tap_track_rule rule, uint64_t seq, int64_t now_us);
/* A publish on ch (NULL: no memory for the channel) is about to be stored: the rules that look at publishes. */
void trk_warn_publish(struct tap_track_conn *c, struct trk_chan *ch, const struct tap_publish *p, int64_t now_us);
/* Slot e of ch leaves state WAIT (answered by ev, or ended) or HELD; call before its state changes. */
void trk_warn_settled(struct trk_chan *ch, const struct trk_slot *e, enum trk_event ev, int64_t now_us);
/* A publish record was written: an id whose publish the client may retransmit (nacked, returned, unknown) leaves
 * the window of recent ids, so the retransmission is no duplicate. */
void trk_warn_done(struct tap_track_conn *c, const struct trk_view *v, const struct trk_verdict *vd);
/* ch ends (its close record is written; it is freed next). */
void trk_warn_chan_end(struct tap_track_conn *c, struct trk_chan *ch, int64_t now_us);
/* Frees what c keeps for the rules. */
void trk_warn_conn_free(struct tap_track_conn *c);

/* Whether a channel not known yet would go past the channel_max the client's tune-ok set: as many channels are open
 * already (RabbitMQ counts open channels, whatever their numbers, and refuses one more with a connection error), so
 * no state is kept for it. */
bool trk_chan_beyond_max(const struct tap_track_conn *c);

/* track.c: every publish of c still waiting is flagged BLOCKED; the tick is to look at c at now_us. */
void trk_mark_blocked(struct tap_track_conn *c);
void trk_due_now(struct tap_track_conn *c, int64_t now_us);

/* ---- track_record.c: each builds one record in t->render.rec (the caller emits it) ---- */

/* Takes the identity members (tap_id, run, started_us) of conf. */
void trk_render_init(struct trk_render *r, const struct tap_track_conf *conf);
void trk_render_deinit(struct trk_render *r);
/* The `publish` record. */
void trk_record_publish(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v,
                        const struct trk_verdict *vd, int64_t now_us);
/* A publisher anti-pattern seen on publish seq of channel ch. */
void trk_record_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *rule,
                        uint64_t seq, int64_t now_us);
/* A Return as a warning: rule unmatched_return (seq_first 0), or ambiguous_return with the confirm sequence
 * numbers of the first and last of the n publishes it may belong to (0: not in confirm mode). */
void trk_record_return_warning(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                               const struct tap_return *ret, const char *rule, uint64_t n, uint64_t seq_first,
                               uint64_t seq_last, int64_t now_us);
void trk_record_channel(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch, const char *event,
                        int64_t now_us);
/* culprit (NULL: none) is the JSON object of trk_render_culprit. */
void trk_record_channel_close(struct trk_render *r, const struct tap_track_conn *c, uint16_t ch,
                              const struct trk_reason *why, uint64_t unconfirmed, const char *culprit,
                              size_t culprit_len, int64_t now_us);
/* {"conn":..,"channel":..,"seq":..,"message_id":..,"exchange":..,"routing_key":..} of a refused publish. */
void trk_render_culprit(struct tap_buf *out, const struct tap_track_conn *c, uint16_t ch, const struct trk_view *v);
void trk_record_conn_open(struct trk_render *r, const struct tap_track_conn *c, int64_t now_us);
void trk_record_conn_close(struct trk_render *r, const struct tap_track_conn *c, const struct trk_reason *why,
                           int64_t now_us);
void trk_record_blocked(struct trk_render *r, const struct tap_track_conn *c, bool blocked, struct tap_slice reason,
                        int64_t now_us);
/* The "conn", "client", "vhost", "user" members every publish record of c starts with, into c->prefix. */
void trk_render_prefix(struct tap_buf *prefix, const struct tap_track_conn *c);
/* What trk_render_extra found worth counting. */
enum trk_extra_note {
	TRK_EXTRA_KEYS_CUT = 1 << 0,     /* header keys cut to TAP_TRACK_HEADER_*_MAX */
	TRK_EXTRA_VALUES_CUT = 1 << 1,   /* header values cut to TAP_TRACK_HEADER_VALUE*_MAX */
	TRK_EXTRA_TRACE_BAD = 1 << 2,    /* a traceparent header that is no W3C traceparent: left out */
};
/* The optional members of a publish record (content_type, message_type, app_id, headers, header_values of the
 * comma-separated keys in header_values (NULL: none), trace_id and span_id), rendered once when it is published,
 * into out; returns enum trk_extra_note bits. */
unsigned trk_render_extra(struct tap_buf *out, const struct tap_publish *p, const char *header_values);
void trk_summary(const struct tap_track *t, struct tap_buf *out);

#endif
