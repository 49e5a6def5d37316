/* The per-publish verdict tracker: fed with decoded AMQP events of both directions of every connection, it pairs
 * each basic.publish with the broker's Basic.Ack/Nack/Return (or the end of its channel) and writes exactly one
 * `publish` record per publish, plus connection/channel/blocked/warning records (src/DESIGN.md §3-§4, src/PROTOCOL.md §7-§11).
 * Pure core: no I/O, never reads the clock; every call takes now_us (Unix time in microseconds). */
#ifndef AMQPTAP_TRACK_H
#define AMQPTAP_TRACK_H

#include "amqptap/fault.h"
#include "amqptap/dir.h"
#include "amqptap/hist.h"
#include "amqptap/jsonl.h"
#include "amqptap/props.h" /* struct tap_slice */
#include "amqptap/record.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The defaults of struct tap_track_conf (the single source: --help prints these). */
#define TAP_TRACK_RETURN_WINDOW_US_DEFAULT 2000000
#define TAP_TRACK_LATE_RETURN_US_DEFAULT 50000
#define TAP_TRACK_MAX_OUTSTANDING_DEFAULT 1000000u
#define TAP_TRACK_MAX_MEMORY_DEFAULT (UINT64_C(256) << 20)
#define TAP_TRACK_TOPOLOGY_INTERVAL_US_DEFAULT 60000000
#define TAP_TRACK_STALL_AFTER_US_DEFAULT 30000000
#define TAP_TRACK_CONSUMER_TIMEOUT_US_DEFAULT (INT64_C(30) * 60 * 1000000) /* RabbitMQ's consumer_timeout */

/* The version of the record layout, in each connection open record; raised when a member changes meaning. */
#define TAP_TRACK_SCHEMA 2 /* 2: body_size may be null (a publish cut before its content header) */
#define TAP_TRACK_RUN_MAX TAP_RECORD_RUN_MAX
#define TAP_TRACK_TAP_ID_MAX 256u

/* What a publish record keeps of the keys of its headers table: at most this many keys and this many bytes of
 * their JSON (quotes, escapes and commas included); a record cut to fit says "headers_truncated":true. */
#define TAP_TRACK_HEADER_KEYS_MAX 32u
#define TAP_TRACK_HEADER_BYTES_MAX 1024u

/* --header-values: what a publish record keeps of the values of the headers it names: at most this many keys, this
 * many bytes of JSON per value (a string is cut to fit and ends with "…"; a table or array that does not fit is
 * null) and in all; anything cut says "header_values_truncated":true. */
#define TAP_TRACK_HEADER_VALUES_KEYS_MAX 8u
#define TAP_TRACK_HEADER_VALUE_BYTES_MAX 256u
#define TAP_TRACK_HEADER_VALUES_BYTES_MAX 1024u

/* Zero fields take the defaults above. */
struct tap_track_conf {
	int64_t return_window_us; /* non-confirm mandatory publishes wait this long for a Return */
	int64_t late_return_us;   /* an ack of a mandatory publish is held this long for a late Return */
	uint32_t max_outstanding; /* per connection; beyond it the oldest is written as evicted */
	/* Bytes of tracking state (outstanding publishes, their strings, channels, connections) for the whole
	 * process; past it the oldest outstanding publishes of any connection are written as evicted. */
	uint64_t max_memory;
	/* Identity, copied; run NULL: left out of every record (replay, so its records stay
	 * deterministic). Every record then carries "run", and the connection open record also "tap", "started" and
	 * "schema"; (run, conn) names one connection across taps and restarts. */
	const char *tap_id;  /* --tap-id */
	const char *run;     /* this process's id: at most TAP_TRACK_RUN_MAX bytes of [0-9a-z] */
	int64_t started_us;  /* when this process started */
	/* The consumer warnings: consumer_stalled after this long with prefetch deliveries unacked and no settle;
	 * unacked_near_timeout at 80 % of the broker's consumer_timeout. 0: the defaults. */
	int64_t stall_after_us;
	int64_t consumer_timeout_us;
	/* Comma-separated header keys whose values publish records carry (--header-values); NULL: none. Not copied:
	 * it must outlive the tracker. */
	const char *header_values;
	/* --definitions (tap_track_set_topology): dropped_by_topology and topology_mismatch repeat for one exchange and
	 * routing key at most this often; 0: TAP_TRACK_TOPOLOGY_INTERVAL_US_DEFAULT. */
	int64_t topology_interval_us;
	/* --identity (enum tap_identity_mode of amqptap/identity.h; 0: auto) and --resend-window (0: the default). */
	unsigned identity_mode;
	int64_t resend_window_us;
};
#define TAP_TRACK_RESEND_WINDOW_US_DEFAULT 60000000

/* One record, without its newline; json is valid only during the call. */
typedef void (*tap_track_emit_fn)(void *ctx, const char *json, size_t len);

struct tap_track;
struct tap_track_conn;

/* The decided verdict of one publish, handed to the verdict hook once per `publish` record (src/DESIGN.md §4 names the
 * values). Slices are valid only during the call. */
enum tap_track_route {
	TAP_TRACK_ROUTE_ROUTED,
	TAP_TRACK_ROUTE_RETURNED,
	TAP_TRACK_ROUTE_UNPROVEN,
	TAP_TRACK_ROUTE_UNKNOWN,
};
enum tap_track_confirm {
	TAP_TRACK_CONFIRM_ACK,
	TAP_TRACK_CONFIRM_NACK,
	TAP_TRACK_CONFIRM_NONE,
	TAP_TRACK_CONFIRM_UNKNOWN,
};
enum tap_track_order {
	TAP_TRACK_ORDER_NONE, /* no Return, or no confirm to order it against */
	TAP_TRACK_ORDER_RETURN_BEFORE_ACK,
	TAP_TRACK_ORDER_ACK_BEFORE_RETURN,
};

struct tap_track_verdict {
	uint64_t conn;
	uint16_t channel;
	bool has_seq; /* the channel was in confirm mode */
	uint64_t seq;
	struct tap_slice exchange, routing_key, message_id; /* message_id.ptr NULL: none */
	bool mandatory, tx;
	uint64_t body_size;
	enum tap_track_route route;
	enum tap_track_confirm confirm;
	enum tap_track_order order;
	bool multiple;          /* the ack/nack had multiple set */
	uint16_t reply_code;    /* route returned */
	struct tap_slice reply_text;
	const char *reason_by;  /* why it ended unknown: "broker", "client", "eof", "evicted", ...; NULL: none */
	bool has_reason_code;
	uint16_t reason_code;
	struct tap_slice reason_text;
	int64_t t_pub;          /* the publish's last frame went to the broker */
	int64_t t_record;       /* the record's ts */
	int64_t return_us;      /* -1: no Return */
	int64_t confirm_us;     /* -1: no ack/nack */
	bool dropped_by_topology; /* --definitions: not mandatory, and the model routes it to no queue */
	struct tap_slice record; /* the publish record as emitted, without its newline; ptr NULL: lost (no memory) */
	/* the bytes [values_at, values_at + values_len) of record hold its "header_values" and
	 * "header_values_truncated" (--header-values) with the comma before them: the record without them is valid
	 * JSON. values_len 0: it has none. */
	size_t values_at, values_len;
	int repeat;            /* enum tap_identity_repeat when its identity was seen before, else -1 */
	int64_t repeat_ago_us; /* from the previous attempt's publish */
};
typedef void (*tap_track_verdict_fn)(void *ctx, const struct tap_track_verdict *v);

/* A connection's life as the connection hook sees it, once per `connection` or `blocked` record. */
enum tap_track_conn_change {
	TAP_TRACK_CONN_OPENED,    /* connection.open seen: the broker answered the handshake */
	TAP_TRACK_CONN_BLOCKED,   /* connection.blocked */
	TAP_TRACK_CONN_UNBLOCKED, /* connection.unblocked */
	TAP_TRACK_CONN_ENDED,     /* the TCP connection is gone; reason_by is its close record's "by" */
};
struct tap_track_conn_event {
	uint64_t conn;
	enum tap_track_conn_change change;
	const char *reason_by; /* TAP_TRACK_CONN_ENDED only ("client" or "broker" after a connection.close, else how
	                        * the TCP connection ended: "unreachable", "client_eof", ...); else NULL */
	bool opened;           /* TAP_TRACK_CONN_ENDED only: its connection.open was seen */
	int64_t now_us;
};
typedef void (*tap_track_conn_event_fn)(void *ctx, const struct tap_track_conn_event *e);

/* --definitions: the routing model (route.h) every publish from now on is judged by, NULL: none. Not owned: the
 * caller frees the model it replaces after this call (a reload swaps a whole model; a failed one never comes here).
 * Returns 0, or TAP_E_NOMEM (no memory for the judge's tables: the model is not used). */
struct tap_route_model;
int tap_track_set_topology(struct tap_track *t, struct tap_route_model *m);
/* Calls fn for each exchange the model routed publishes that were not mandatory nowhere from, with how many; ""
 * stands for the default exchange, NULL for the exchanges past the first TAP_TRACK_TOPOLOGY_EXCHANGES. */
#define TAP_TRACK_TOPOLOGY_EXCHANGES 1000u
typedef void (*tap_track_drop_fn)(void *ctx, const char *exchange, size_t len, uint64_t count);
void tap_track_each_topology_drop(const struct tap_track *t, tap_track_drop_fn fn, void *ctx);

/* Returns NULL when out of memory. */
struct tap_track *tap_track_new(const struct tap_track_conf *conf, tap_track_emit_fn emit, void *ctx);
/* fn (NULL: none) is called once per `publish` record, right after the record is emitted. */
void tap_track_set_verdict_hook(struct tap_track *t, tap_track_verdict_fn fn, void *ctx);
/* fn (NULL: none) is called after each connection open, blocked and close record is emitted. */
void tap_track_set_conn_hook(struct tap_track *t, tap_track_conn_event_fn fn, void *ctx);
/* fn (NULL: none) is called once per `resend_missing` record, right after it is emitted, with the record (ptr NULL:
 * it could not be rendered, for memory). */
typedef void (*tap_track_missing_fn)(void *ctx, struct tap_slice record);
void tap_track_set_missing_hook(struct tap_track *t, tap_track_missing_fn fn, void *ctx);
/* Frees every connection still open without writing anything (call tap_track_shutdown first to write them). */
void tap_track_free(struct tap_track *t);

/* Addresses are copied. Returns NULL when out of memory, the connection counted in conns_unfollowed. */
struct tap_track_conn *tap_track_conn_new(struct tap_track *t, uint64_t conn_id, const char *client_addr,
                                          const char *upstream_addr, int64_t now_us);
/* Memory its observer keeps for the connection (the decoder's channel table), counted in max_memory: room is made
 * first; false, and nothing counted, when n more bytes do not fit. uncharge gives back what charge counted. */
bool tap_track_conn_charge(struct tap_track_conn *c, uint64_t n, int64_t now_us);
void tap_track_conn_uncharge(struct tap_track_conn *c, uint64_t n);
/* A connection its observer had no memory to follow (it gets no records): counted in conns_unfollowed. */
void tap_track_conn_unfollowed(struct tap_track *t);
/* Connection facts as they are seen on the wire; each optional; slices are copied. */
void tap_track_conn_client_props(struct tap_track_conn *c, struct tap_slice product, struct tap_slice version,
                                 struct tap_slice platform);
void tap_track_conn_user(struct tap_track_conn *c, struct tap_slice user); /* never a password */
/* The capabilities a client advertises in its client properties (the "capabilities" table), as bits. */
enum tap_track_cap {
	TAP_TRACK_CAP_CONNECTION_BLOCKED = 1 << 0,
	TAP_TRACK_CAP_PUBLISHER_CONFIRMS = 1 << 1,
	TAP_TRACK_CAP_CONSUMER_CANCEL_NOTIFY = 1 << 2,
	TAP_TRACK_CAP_BASIC_NACK = 1 << 3,
};
/* A connection_name longer than this is kept cut to it (bytes, then escaped). */
#define TAP_TRACK_CONN_NAME_MAX 256u
/* The client's connection_name property (ptr NULL: none) and its capabilities table: has_caps false when it sent
 * none, else which of the four it said true (present: which it named at all). Copied; written on the open record. */
void tap_track_conn_client_caps(struct tap_track_conn *c, struct tap_slice connection_name, bool has_caps,
                                unsigned present, unsigned caps);
void tap_track_conn_tune(struct tap_track_conn *c, uint16_t channel_max, uint32_t frame_max, uint16_t heartbeat);
/* connection.open (or open-ok): writes the `connection` open record, once. vhost.ptr NULL: not known (its
 * records say details_lost). */
void tap_track_conn_open(struct tap_track_conn *c, struct tap_slice vhost, int64_t now_us);
/* connection.blocked with its reason, and connection.unblocked: a `blocked` or `unblocked` record each. */
void tap_track_conn_blocked(struct tap_track_conn *c, struct tap_slice reason, int64_t now_us);
void tap_track_conn_unblocked(struct tap_track_conn *c, int64_t now_us);
/* The tap stopped (held) or went on reading what the broker sends on this connection: backpressure from a client
 * that reads slowly. While held, a Return or a refusing close may wait unread in the tap's socket, so no window
 * runs out; each runs again in full once reading goes on. */
enum tap_track_hold {
	TAP_TRACK_UNHELD, /* reading the broker again */
	TAP_TRACK_HELD,   /* not reading the broker */
};
void tap_track_conn_held(struct tap_track_conn *c, enum tap_track_hold hold, int64_t now_us);
/* --fault (include/amqptap/fault.h): the client is shown `saw` for publish seq of channel ch because of rule `rule`;
 * the publish record says so ("client_saw", "fault") next to the broker's verdict. Call before the tracker sees the
 * broker's confirm of it. */
void tap_track_fault_mark(struct tap_track_conn *c, uint16_t ch, uint64_t seq, enum tap_fault_saw saw, uint32_t rule);
/* A rule acted: the `fault` record. close-channel: the tap closed the channel on the broker's side (after the
 * publish it acted on, which the tracker saw before): its outstanding publishes keep what the broker says until
 * both peers answered the close (tap_track_channel_fault_close_wait), then end with {"by":"fault"}. */
void tap_track_fault(struct tap_track_conn *c, const struct tap_fault_act *a, int64_t now_us);
/* A channel.close-ok from peer `by` on channel ch: true when ch is being closed by a close-channel rule and the
 * other peer has not answered yet, so this close-ok is not the channel's end. Both peers answer such a close (the
 * client the close it was shown, the broker the tap's); the channel ends at the second, whichever it is: publishes the
 * client sent after the broker's close-ok, before its own, still get their seq and end {"by":"fault"}. */
bool tap_track_channel_fault_close_wait(struct tap_track_conn *c, uint16_t ch, enum tap_peer by);
/* connection.close from either side: remembered (the first one wins) as the reason given to every publish still
 * outstanding when the connection ends. */
void tap_track_conn_close(struct tap_track_conn *c, enum tap_peer by, uint16_t code, struct tap_slice text,
                          int64_t now_us);
/* Why the TCP or TLS connection failed (e.g. "certificate verify failed"), shown as the `text` of the reason
 * when no close method gave one. Copied. */
void tap_track_conn_detail(struct tap_track_conn *c, const char *detail);
/* The broker's address, changed before connection.open (the proxy went on to the name's next address); forgets the
 * upstream_local of the last one. Copied. */
void tap_track_conn_upstream(struct tap_track_conn *c, const char *addr);
/* The proxy's own address on its connection to the broker ("ip:port": what the broker, and a sniffer on its host,
 * see as the client), written as `upstream_local` in the open and close records. Copied. */
void tap_track_conn_upstream_local(struct tap_track_conn *c, const char *addr);
/* connection.close-ok from the broker to the client's connection.close: the broker said all it had to say, so
 * publishes still in their return window when the connection ends got no Return (unproven). */
void tap_track_conn_close_ok(struct tap_track_conn *c, int64_t now_us);
/* The TCP connection is gone: every outstanding publish gets its record (reason: the channel.close or
 * connection.close seen earlier, else {"by":reason_by}), channel close records and the `connection` close record
 * are written, and c is freed. */
void tap_track_conn_end(struct tap_track_conn *c, const char *reason_by, int64_t now_us);

/* A channel opened again before the broker's close-ok (or never closed) is retired, not ended: the broker's
 * answers still to come on it are for its publishes, until its close-ok or the new channel's open-ok. */
void tap_track_channel_open(struct tap_track_conn *c, uint16_t ch, int64_t now_us);
void tap_track_channel_open_ok(struct tap_track_conn *c, uint16_t ch, int64_t now_us);
void tap_track_confirm_select(struct tap_track_conn *c, uint16_t ch, int64_t now_us);
void tap_track_tx_select(struct tap_track_conn *c, uint16_t ch, int64_t now_us);
void tap_track_channel_close(struct tap_track_conn *c, uint16_t ch, enum tap_peer by, uint16_t code,
                             struct tap_slice text, int64_t now_us);
/* The broker's channel.close on ch (given first with tap_track_channel_close), or with ch 0 its connection.close
 * (given first with tap_track_conn_close), names basic.publish (class 60, method 40) as its cause. The culprit is
 * the earliest outstanding publish the close text points at: its exchange is named ('x', as in 404, 403 and 540
 * texts), or the text is about user_id and the publish's user_id is not the login user, or about immediate and
 * the publish set it (RabbitMQ implements neither: 540), or the text gives a message size equal to the publish's
 * body size. It and the publishes after it on its channel end with the
 * close's reason (route unknown, "refused":"culprit" / "after_culprit"); the ones before it keep their verdict;
 * the channel close record names the culprit. When the text points at none, every publish still waiting on the
 * channel (on every channel, for a connection.close) may be it: each ends unknown with the reason and
 * "refused":"candidate", never with a guessed verdict. */
void tap_track_publish_refused(struct tap_track_conn *c, uint16_t ch, int64_t now_us);
/* How a transaction ends: tx.commit or tx.rollback (and their -ok). */
enum tap_track_tx_end {
	TAP_TRACK_TX_COMMIT,
	TAP_TRACK_TX_ROLLBACK,
};
/* tx.commit or tx.rollback from the client: the publishes made before it on the channel are the transaction its
 * answer ends. */
void tap_track_tx_end(struct tap_track_conn *c, uint16_t ch, enum tap_track_tx_end how, int64_t now_us);
/* tx.commit-ok or tx.rollback-ok from the broker, for the oldest tx.commit / tx.rollback unanswered (without one,
 * every publish of the channel still waiting). Committed: the broker sent every Return of them before, so a
 * mandatory one still waiting was routed, another unproven. Rolled back: discarded (unknown, tx_rollback). A
 * transaction that ends any other way (the channel or connection closes) ends unknown with the close's reason. */
void tap_track_tx_end_ok(struct tap_track_conn *c, uint16_t ch, enum tap_track_tx_end how, int64_t now_us);
/* channel.close-ok from either side: the channel is gone; its outstanding publishes end with the close's reason. */
void tap_track_channel_close_ok(struct tap_track_conn *c, uint16_t ch, int64_t now_us);

/* Slices are valid only during the call; the tracker copies what it keeps. */
struct tap_publish {
	struct tap_slice exchange, routing_key, message_id, correlation_id, content_type, type, app_id, user_id;
	bool mandatory, immediate, has_message_id, has_user_id, has_correlation_id, has_delivery_mode, has_timestamp;
	uint8_t delivery_mode;
	uint64_t timestamp;
	uint64_t body_size;
	const struct tap_slice *header_keys; /* records keep TAP_TRACK_HEADER_KEYS_MAX / _BYTES_MAX of them */
	size_t n_header_keys;
	struct tap_slice headers; /* the headers table (without its length), for header values and traceparent: the
	                           * fields tap_track_header_wanted names are enough */
	bool headers_cut;          /* one of those was too long to keep: its value is said cut */
	bool details_lost; /* no memory kept its strings: exchange, routing key, ids and properties are not known */
	bool content_cut;  /* the connection ended before its content did: written unknown whatever its channel */
	bool header_lost;  /* content_cut before the content header: no property is known (body_size is written null),
	                    * so no rule judges them */
	uint8_t identity_kind; /* enum tap_identity_kind: how identity was made; 0: it has none */
	uint64_t identity;
};
/* The conf's identity mode (enum tap_identity_mode): what the decoder hashes. */
unsigned tap_track_identity_mode(const struct tap_track *t);

/* Whether a header field of this name may be shown in a record: traceparent, or one of the --header-values keys. */
bool tap_track_header_wanted(const struct tap_track *t, const uint8_t *name, size_t len);

/* A publish is complete: its last frame was forwarded to the broker at now_us (or, content_cut, the connection is
 * ending without the rest: tap_track_conn_end follows). */
void tap_track_publish(struct tap_track_conn *c, uint16_t ch, const struct tap_publish *p, int64_t now_us);
/* basic.ack / basic.nack from the broker (never the client's consumer acks): tag is the delivery tag, multiple
 * its flag (every outstanding seq <= tag; tag 0 with multiple: everything outstanding). */
void tap_track_ack(struct tap_track_conn *c, uint16_t ch, uint64_t tag, bool multiple, int64_t now_us);
void tap_track_nack(struct tap_track_conn *c, uint16_t ch, uint64_t tag, bool multiple, int64_t now_us);

struct tap_return {
	uint16_t reply_code;
	struct tap_slice reply_text, exchange, routing_key, message_id;
	bool has_message_id;
	uint64_t body_size;
	bool details_lost; /* no memory kept its strings: which publish it returns is not known */
};
/* basic.return with its content header complete. */
void tap_track_return(struct tap_track_conn *c, uint16_t ch, const struct tap_return *r, int64_t now_us);

/* Writes the records whose return window or late-return hold has passed. Returns the time of the next deadline,
 * or INT64_MAX when nothing waits. Call it periodically (e.g. every 10 ms). */
int64_t tap_track_tick(struct tap_track *t, int64_t now_us);
/* Every pending publish of every connection is written (reason {"by":"shutdown"}; acked but held ones keep their
 * real verdict), connections are closed and freed. */
void tap_track_shutdown(struct tap_track *t, int64_t now_us);
/* Appends a human summary: for the TAP_TRACK_SUMMARY_CONNS live connections with the most publishes outstanding
 * (held ones included; then the oldest), how many more there are, and the total of every connection. */
#define TAP_TRACK_SUMMARY_CONNS 20
void tap_track_summary(struct tap_track *t, struct tap_buf *out);

/* The publisher anti-patterns a `warning` record names (src/DESIGN.md §4; README "Warnings" says why each matters). */
enum tap_track_rule {
	TAP_TRACK_RULE_CONFIRM_WITHOUT_MANDATORY,
	TAP_TRACK_RULE_ACK_BEFORE_RETURN,
	TAP_TRACK_RULE_UNMATCHED_RETURN,
	TAP_TRACK_RULE_TRANSIENT_IN_CONFIRM_MODE,
	TAP_TRACK_RULE_MISSING_MESSAGE_ID,
	TAP_TRACK_RULE_PUBLISH_AND_WAIT,
	TAP_TRACK_RULE_CHANNEL_CHURN,
	TAP_TRACK_RULE_DUPLICATE_MESSAGE_ID,
	TAP_TRACK_RULE_AMBIGUOUS_RETURN,
	TAP_TRACK_RULE_DROPPED_BY_TOPOLOGY, /* --definitions: a publish not mandatory that the model routes nowhere */
	TAP_TRACK_RULE_TOPOLOGY_MISMATCH,   /* --definitions: a Return or a routed mandatory ack the model disagrees with */
	/* the consumer side (amqptap/consume.h) */
	TAP_TRACK_RULE_CONSUMER_STALLED,
	TAP_TRACK_RULE_REQUEUE_LOOP,
	TAP_TRACK_RULE_UNBOUNDED_PREFETCH,
	TAP_TRACK_RULE_GLOBAL_QOS,
	TAP_TRACK_RULE_UNACKED_NEAR_TIMEOUT,
	TAP_TRACK_N_RULES,
};
/* The rule's name as records write it. */
const char *tap_track_rule_name(enum tap_track_rule rule);

/* publish_and_wait: this many consecutive confirm-mode publishes on a channel, each made with nothing of the
 * channel awaiting its confirm and at most TAP_TRACK_WAIT_GAP_US after the confirm of the publish before it. */
#define TAP_TRACK_WAIT_RUN 10u
#define TAP_TRACK_WAIT_GAP_US 10000
/* channel_churn: this many channels of a connection closed after carrying exactly one publish each. */
#define TAP_TRACK_CHURN_CHANNELS 10u
/* duplicate_message_id: a message_id repeats one of the last this many distinct ids published on the connection. */
#define TAP_TRACK_RECENT_IDS 1024u

struct tap_track_stats {
	uint64_t publishes;       /* tap_track_publish calls */
	uint64_t publish_records; /* `publish` records written: equals publishes once nothing is outstanding */
	uint64_t routed, returned, unproven, unknown;
	uint64_t acked, nacked, confirm_none, confirm_unknown;
	uint64_t evicted;          /* by max_outstanding and by max_memory */
	uint64_t evicted_memory;   /* of which by max_memory */
	uint64_t headers_truncated; /* publishes whose header keys were cut to TAP_TRACK_HEADER_*_MAX */
	uint64_t header_values_truncated; /* publishes whose header values were cut (TAP_TRACK_HEADER_VALUE*) */
	uint64_t traceparent_malformed;   /* publishes with a traceparent header that is no W3C traceparent */
	uint64_t memory;           /* bytes of tracking state now (what max_memory bounds) */
	uint64_t memory_peak;
	uint64_t outstanding;    /* publishes not yet written (including acked ones held for a late Return) */
	uint64_t held;           /* of which acked and held */
	uint64_t stray_confirms; /* acks/nacks for a tag never published or already answered */
	uint64_t unmatched_returns;
	uint64_t records; /* every record of every type */
	uint64_t warnings;
	uint64_t warnings_by_rule[TAP_TRACK_N_RULES];
	uint64_t connections_open, connections_total;
	uint64_t oom;         /* times the tracker was short of memory: a record lost, a verdict written before its
	                       * window or hold ended, a publish's details or a record's optional members left out */
	uint64_t records_oom; /* of which records lost: no memory to render them */
	uint64_t conns_unfollowed; /* connections forwarded or read with no records at all: no memory to follow them */
	uint64_t chans_unfollowed; /* channel opens not followed: the channel did not fit in max_memory (its
	                            * publishes are written unknown at once, reason no_memory) */
	uint64_t topology_judged;     /* --definitions: publishes the model was asked about */
	uint64_t dropped_by_topology; /* of which not mandatory and routed nowhere by the model */
	/* the identity table (--identity): repeats by kind, resend_missing records, and what its bound forgot */
	uint64_t resends, duplicates, unverified, resend_missing;
	uint64_t ident_evicted;            /* settled identities forgotten before their window was over */
	uint64_t ident_evicted_unresolved; /* unknown ones forgotten before a resend or their resend_missing */
	uint64_t ident_untracked;          /* identities no memory was left to keep at all */
	uint64_t ident_memory;             /* bytes the table holds now (in memory as well) */
	uint64_t resend_delay_count, resend_delay_sum_us; /* of the resends: from the previous attempt's publish */
};
void tap_track_get_stats(const struct tap_track *t, struct tap_track_stats *s);
/* The run id every record carries, "" when records carry none (replay). */
const char *tap_track_run(const struct tap_track *t);

/* Confirm latency quantile (0..1) over every acked/nacked publish, in microseconds; 0 when none. Log-linear
 * histogram: within 1/16 (6.25 %) of the true value. */
uint64_t tap_track_confirm_quantile(const struct tap_track *t, double q);
/* The confirm latency histogram of the process (µs), e.g. for cumulative metrics buckets; valid while t is. */
const struct tap_hist *tap_track_confirm_hist(const struct tap_track *t);

/* ---- read access for the metrics endpoint: what a scrape or the status page shows ---- */

/* One live connection; the strings are NULL until seen and valid only during the callback. */
struct tap_track_conn_info {
	uint64_t id;
	const char *client, *product, *user, *vhost;
	uint64_t publishes, routed, returned, unproven, unknown, acked, nacked;
	uint64_t outstanding;
	uint32_t channels; /* open channels the tracker knows of */
	bool blocked;
	int64_t since_us; /* when the connection was seen first */
};
typedef void (*tap_track_conn_fn)(void *ctx, const struct tap_track_conn_info *info);
/* Calls fn for every live connection, newest first. */
void tap_track_each_conn(const struct tap_track *t, tap_track_conn_fn fn, void *ctx);

/* One non-empty bucket of the confirm latency histogram: count latencies in [lo_us, hi_us). */
typedef void (*tap_track_bucket_fn)(void *ctx, uint64_t lo_us, uint64_t hi_us, uint64_t count);
/* Calls fn for every non-empty bucket of the process-wide confirm latency histogram, in ascending order. */
void tap_track_each_confirm_bucket(const struct tap_track *t, tap_track_bucket_fn fn, void *ctx);

/* The capture lost bytes of this connection (replay, sniff): every outstanding publish is written now, route
 * "unknown" (or "returned" when its Return was seen) with {"by":"capture_gap"}; with TAP_TRACK_GAP_SEQ_LOST (the
 * publishes came after a client-side gap, so their confirm sequence numbers are not known) with "seq": null. */
enum tap_track_gap_seq { TAP_TRACK_GAP_SEQ_KNOWN, TAP_TRACK_GAP_SEQ_LOST };
void tap_track_conn_gap(struct tap_track_conn *c, enum tap_track_gap_seq seq, int64_t now_us);
/* Client bytes of this connection were not captured: by = "capture_start" (the capture began after the
 * connection) or "capture_gap" (a client-side hole). A confirm.select or tx.select may have been among them, so
 * every channel in no known mode, and every channel first seen at a publish from now on, has an unknown mode (a
 * `channel` record with "event":"mode_unknown"): its publishes are written at once with route and confirm
 * "unknown", "seq": null and {"by": by}, until a confirm.select, tx.select or channel.open is seen on it. */
void tap_track_conn_unseen(struct tap_track_conn *c, const char *by, int64_t now_us);

#endif
