/* The bottom of the tracker: the types every layer shares. The tracker is built in layers that call one way,
 * each file calling only the ones below it (its header says what it offers):
 *
 *   wire events  track.c         publishes, their confirms, time passing (return windows and holds run out)
 *                track_return.c  Returns and publish-caused closes
 *                track_conn.c    the tracker, connections and channels open and close, capture gaps
 *                                (track_event.h: the one thing track.c borrows from track_conn.c)
 *   budget       track_budget.c  the memory budget and the outstanding bound: evictions, and channels and
 *                                strings made room for  (track_budget.h)
 *   lifecycle    track_verdict.c verdict_of decides each publish's verdict, trk_slot_step moves a slot through
 *                                the states drawn below and ends it in its one `publish` record
 *                                (track_verdict.h)
 *   consumers    track_warn.c    the warning rules: every rule decided and counted there  (track_warn.h)
 *                track_ident.c   the identities written: repeats (attempt, previous) and resend_missing
 *                                (track_ident.h)
 *                track_record.c  the records as JSON, and trk_emit, the hook that hands them out
 *                                (track_record.h)
 *   store        track_store.c   allocation counted in the budget, channels, slot rings, queues, the deadline
 *                                heap of the timers  (track_store.h)
 *   types        this file
 *
 * Warnings and records read the store and write through the emit hook: they never call the layers above. */
#ifndef AMQPTAP_TRACK_INT_H
#define AMQPTAP_TRACK_INT_H

#include "amqptap/consume.h"
#include "amqptap/fault.h"
#include "amqptap/json.h"
#include "amqptap/record.h"
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
 * track_verdict.c and writes the one `publish` record (route/confirm, order when both a Return and a confirm exist):
 *
 *   publish, nothing to wait for (late-return hold 0) ------------------------> DONE unproven/none
 *   publish, plain (no confirm, not mandatory) --> WAIT (PLAIN: held for a publish-caused close)
 *   WAIT, PLAIN --hold over, settled, or end----------------> DONE unproven/none
 *   WAIT, PLAIN --the broker's publish-caused close names it or an earlier one--> WAIT (REFUSED)
 *   publish, confirm mode or mandatory or channel closing --> WAIT
 *   WAIT --ack, mandatory, no Return yet---------------------> HELD (a late Return may still come, src/PROTOCOL.md §9)
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
	TRK_FLAG_TOPO_NONE = 1 << 19, /* --definitions: the model routes it to no queue */
	TRK_FLAG_TOPO_SOME = 1 << 20, /* --definitions: the model routes it to a queue */
	TRK_FLAG_IDENT_ID = 1 << 21,  /* its blob ends with its identity, made of its message_id */
	TRK_FLAG_IDENT_FP = 1 << 22,  /* ... made of its fingerprint */
};

/* How the broker's publish-caused close (if any) on a channel pointed at the publish it refused. */
enum trk_refusal {
	TRK_REFUSAL_NONE = 0,
	TRK_REFUSAL_NAMED,   /* one publish is the culprit: ch->culprit */
	TRK_REFUSAL_UNNAMED, /* the close text points at none: every publish then waiting is a candidate */
};

/* One outstanding publish (64 bytes). Its blob in the channel arena: [timestamp, 8 bytes, when present] then
 * message_id then correlation_id then [identity, 8 bytes, when IDENT_ID or IDENT_FP]. Repeating strings are
 * interned per connection. */
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
	bool closing, close_by_broker;
	bool close_by_fault; /* --fault close-channel: the tap closed it on the broker's side */
	bool fault_ok_by[2]; /* close_by_fault: the close-ok of each peer (enum tap_peer) came */
	uint32_t fault_rule; /* close_by_fault: the rule's id */
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
	char *timed_out;         /* the JSON object naming the delivery a consumer timeout closed it for (consume.c) */
	size_t timed_out_len;
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
	char *connection_name; /* the client's, cut to TAP_TRACK_CONN_NAME_MAX */
	bool has_caps;         /* the client sent a capabilities table */
	uint8_t caps_present, caps; /* enum tap_track_cap: named in it, and said true */
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
	/* its confirm latency (the summary line): made at the first ack or nack once it selected confirms, as the run
	 * of buckets its values fell in (a whole tap_hist was most of a connection's memory) */
	struct tap_hist_span *hist;
	bool confirms; /* a channel of it selected confirms */
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
	/* fault injection (tap_track_fault_mark): publishes whose client was shown something else than the broker's
	 * confirm, until their record is written; none without --fault */
	struct trk_fault_mark *fault_marks;
	uint32_t n_fault_marks, cap_fault_marks;
	uint32_t due_idx;      /* place in t->due + 1, 0: not in it (next_due is INT64_MAX) */
	struct csm_conn *csm;  /* the consumer tracker's state (consume_int.h); NULL until a consumer method */
};

/* Where a publish's rendered properties hold "header_values" and "header_values_truncated" (--header-values): the
 * bytes [at, at + len) of the members without braces, with the comma before them unless they come first; len 0:
 * none. Kept with the properties, so that the verdict hook can say where they are in the record. */
struct trk_values {
	uint16_t at, len;
};

/* A publish whose identity this process wrote a record for before (track_ident.c): the attempt it is, and what
 * that record said. */
struct trk_repeat {
	bool seen;
	uint8_t repeat; /* enum tap_identity_repeat */
	uint8_t route, confirm; /* the previous attempt's */
	uint16_t channel;
	bool has_seq;
	uint32_t attempt; /* this one's: 2, 3, ... */
	uint64_t conn, seq;
	int64_t ago_us; /* from the previous attempt's publish to this one's */
};

/* One identity of the table (track_ident.c): the latest attempt written for it. */
struct trk_ident_entry {
	uint64_t key;
	uint64_t conn, seq; /* seq 0: not in confirm mode */
	int64_t t_pub;
	int64_t due;        /* settled: forgotten then; unresolved: its resend_missing then */
	int64_t t_end;      /* its record's ts: a resend_missing written at shutdown is stamped with it */
	char *message_id;   /* unresolved only (NULL: none or no memory), cut to TRK_IDENT_ID_MAX */
	uint32_t prev, next; /* its list, as index + 1 (0: none); a free entry's next is the free list */
	uint32_t attempt;
	uint16_t channel;
	uint8_t route, confirm;
	uint8_t list;       /* enum trk_ident_list */
	uint8_t kind;       /* enum tap_identity_kind */
	uint8_t message_id_len;
};

enum trk_ident_list {
	TRK_IDENT_FREE = 0,
	TRK_IDENT_SETTLED = 1,    /* answered (or not wanting a resend): kept --resend-window to tell duplicates */
	TRK_IDENT_UNRESOLVED = 2, /* ended unknown: a resend is due within --resend-window */
};

struct trk_ident_list_ends {
	uint32_t head, tail; /* index + 1, oldest first */
};

struct trk_ident {
	struct trk_ident_entry *pool;
	uint32_t cap, n, free_head;
	uint32_t *index; /* 2 * cap, linear probing: index + 1 of the entry with that key, 0 empty */
	struct trk_ident_list_ends lists[3];
	uint64_t mem;  /* its share of t->mem */
	uint64_t share; /* the most it takes */
};

/* The record being written, and what every record shares (the run id, the date part of the second being
 * written). Only track_record.c writes these. */
struct trk_render {
	struct tap_buf rec;
	size_t extra_at; /* where the last publish record's rendered properties begin, when it has any */
	struct tap_record_head head;
	char run[TAP_TRACK_RUN_MAX + 1]; /* "": no identity members */
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
	tap_track_missing_fn missing_hook;
	void *missing_ctx;
	struct tap_track_conn *conns;
	struct trk_render render;
	struct tap_buf extra; /* the optional members of the publish being stored */
	struct trk_values extra_values; /* where extra holds the header values */
	struct tap_track_stats st;
	struct tap_consume_stats csm_st; /* the consumer tracker's (consume.c) */
	struct tap_hist csm_hist;        /* its settle latency */
	struct tap_hist csm_queue_hist;  /* publish -> delivery of the linked deliveries (queue_us) */
	int64_t csm_due;                 /* no consumer rule runs out before this (csm_tick) */
	struct csm_link *csm_links;      /* publish -> delivery links (consume_int.h); NULL until a consumer */
	tap_consume_delivery_fn csm_hook; /* tap_consume_set_delivery_hook */
	void *csm_hook_ctx;
	struct trk_counts closed_counts; /* of connections already ended */
	struct tap_hist hist;
	struct tap_hist resend_hist; /* from an attempt's publish to its resend's (µs) */
	/* every channel with outstanding publishes, keyed by the t_pub of its base slot: the oldest outstanding publish
	 * of the process is the base of the top one */
	struct tap_heap oldest;
	/* every connection with a timer running, keyed by next_due: tap_track_tick looks at the due ones only */
	struct tap_heap due;
	uint64_t mem;  /* bytes counted against conf.max_memory */
	bool squeeze;  /* making room: unreferenced strings are freed, not cached */
	struct trk_topo *topo; /* --definitions (track_topo.c); NULL: none */
	bool topo_on;          /* topo has a model */
	uint32_t topo_flags;   /* TRK_FLAG_TOPO_* of the publish being stored */
	struct trk_ident ident; /* the identities written (track_ident.c) */
};

/* A publish a fault rule acted on (tap_track_fault_mark): its record says what the client saw and which rule. */
struct trk_fault_mark {
	uint64_t seq;
	uint32_t rule;
	uint16_t ch;
	uint8_t saw; /* enum tap_fault_saw */
};

/* What a publish record is written from: a stored slot or the caller's tap_publish. */
struct trk_view {
	const uint8_t *exchange, *routing_key, *message_id, *correlation_id, *extra;
	size_t exchange_len, routing_key_len, message_id_len, correlation_id_len, extra_len;
	struct trk_values values; /* in extra */
	bool mandatory, has_message_id, has_correlation_id, has_delivery_mode, has_timestamp, confirm_mode, tx, blocked;
	bool refused, culprit; /* REFUSED, CULPRIT */
	bool route_lost;       /* no memory kept its exchange and routing key: written null */
	bool details_lost;     /* route_lost, or no memory kept its message id, correlation id or timestamp */
	bool refused_unnamed;  /* REFUSED on a channel whose close named no culprit */
	bool header_lost;      /* NO_HEADER: body_size written null */
	uint8_t delivery_mode;
	uint32_t topo; /* TRK_FLAG_TOPO_* */
	uint64_t body_size, seq, timestamp;
	int64_t t_pub;
	uint8_t identity_kind; /* enum tap_identity_kind */
	uint64_t identity;
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

#endif
