/* A model of RabbitMQ's routing (src/PROTOCOL.md §14): vhosts, exchanges of the four built-in types, the default
 * exchange, queues, queue and exchange-to-exchange bindings, alternate exchanges from arguments and policies. Built
 * once (tap_route_add_*, then tap_route_finish), then asked where a publish goes (tap_route). Pure: no I/O, no clock;
 * every byte it holds is counted and bounded by struct tap_route_limits. A model is used by one thread at a time
 * (a lookup marks what it visited in the model). Names are byte strings with a length (they may hold any byte). */
#ifndef AMQPTAP_ROUTE_H
#define AMQPTAP_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_ROUTE_NONE UINT32_MAX

enum tap_route_xtype {
	TAP_RX_DIRECT,
	TAP_RX_FANOUT,
	TAP_RX_TOPIC,
	TAP_RX_HEADERS,
	TAP_RX_UNKNOWN, /* x-delayed-message, x-consistent-hash, any plugin's: never judged */
};

/* A header or binding-argument value as RabbitMQ's parser holds it (rabbit_binary_parser.erl). type is the AMQP
 * type letter of PROTOCOL §12 ('L' is taken as 'l'); definitions' JSON gives 'l' integers, 'd' floats, 'S'
 * strings, 't', 'A', 'F'. At the top of a headers binding RabbitMQ compares values with Erlang's == (1 equals
 * 1.0 and a signed byte 1; S equals x), inside arrays and tables the type letters too. */
enum tap_route_vkind {
	TAP_RV_VOID,
	TAP_RV_BOOL,
	TAP_RV_INT,     /* i; with big, the value is (uint64_t)i >= 2^63 (a T or an unsigned type) */
	TAP_RV_FLOAT,   /* d (an f is widened) */
	TAP_RV_STR,     /* s, len (S and x) */
	TAP_RV_DECIMAL, /* scale, i (signed 32-bit value) */
	TAP_RV_ARRAY,   /* items, len */
	TAP_RV_TABLE,   /* fields, len */
};

struct tap_route_field;

struct tap_route_value {
	enum tap_route_vkind kind;
	char type;
	bool b;
	bool big;
	uint8_t scale;
	uint32_t len;
	int64_t i;
	double d;
	const char *s;
	const struct tap_route_value *items;
	const struct tap_route_field *fields;
};

struct tap_route_field {
	const char *key;
	uint32_t key_len;
	struct tap_route_value v;
};

/* Bounds on what a model may hold; tap_route_limits_default() fills RabbitMQ-sized ones. Past any, the add fails with
 * TAP_E_FULL and the model is unusable (the caller drops it: a half model never judges). */
struct tap_route_limits {
	uint64_t max_bytes; /* everything the model allocates */
	uint32_t max_vhosts, max_exchanges, max_queues, max_bindings, max_policies;
	uint32_t max_name;    /* vhost, exchange, queue names (AMQP short strings: 255) */
	uint32_t max_key;     /* a binding key */
	uint32_t max_pattern; /* a policy's pattern */
	uint32_t max_args;    /* values in one binding's arguments, nested ones included */
	uint32_t max_depth;   /* nesting of arrays and tables in arguments */
};

void tap_route_limits_default(struct tap_route_limits *l);

/* The type of an exchange the definitions name but do not declare (route_defs.c: rabbitmqctl leaves internal
 * exchanges out of its exports): never judged, like any other unknown type. */
#define TAP_ROUTE_OMITTED "(left out of the definitions)"

struct tap_route_model;

/* NULL limits: the defaults. NULL when out of memory. */
struct tap_route_model *tap_route_model_new(const struct tap_route_limits *limits);
void tap_route_model_free(struct tap_route_model *m);
/* Bytes the model holds (every allocation counted). */
uint64_t tap_route_model_bytes(const struct tap_route_model *m);

/* The adds return 0 or a negative status, with a one-line reason in the model (tap_route_error). A vhost is made
 * by its first mention, with RabbitMQ's predeclared exchanges (amq.direct, amq.fanout, amq.topic, amq.headers,
 * amq.match, and amq.rabbitmq.trace: topic, internal). Adding an exchange or queue again replaces nothing and is not
 * an error. type is RabbitMQ's name ("direct", ...); ae, or NULL, the alternate-exchange argument. */
int tap_route_add_vhost(struct tap_route_model *m, const char *vh, size_t vh_len);
int tap_route_add_exchange(struct tap_route_model *m, const char *vh, size_t vh_len, const char *name, size_t name_len,
                           const char *type, size_t type_len, bool internal, const char *ae, size_t ae_len);
int tap_route_add_queue(struct tap_route_model *m, const char *vh, size_t vh_len, const char *name, size_t name_len);
/* A binding from exchange src to a queue or (to_exchange) an exchange. args are copied (a headers exchange's
 * match; x-match must be absent or all, any, all-with-x, any-with-x as RabbitMQ validates it, else
 * TAP_E_BAD_NUMBER... see the error text). The source and destination must have been added. */
int tap_route_add_binding(struct tap_route_model *m, const char *vh, size_t vh_len, const char *src, size_t src_len,
                          bool to_exchange, const char *dest, size_t dest_len, const char *key, size_t key_len,
                          const struct tap_route_field *args, size_t n_args);
/* A policy: pattern is a POSIX extended regular expression searched in the name (RabbitMQ: re:run, PCRE; the
 * PCRE-only forms \d, (?..) and lazy quantifiers are refused), apply_to "exchanges", "queues" or "all"; ae, or
 * NULL, the definition's alternate-exchange. The one matching policy of highest priority applies. */
int tap_route_add_policy(struct tap_route_model *m, const char *vh, size_t vh_len, const char *name, size_t name_len,
                         const char *pattern, size_t pattern_len, const char *apply_to, int64_t priority,
                         const char *ae, size_t ae_len);
/* Applies the policies and makes the model ready for lookups; no add after it. */
int tap_route_finish(struct tap_route_model *m);
/* The reason of the last failed add or finish ("" when none). */
const char *tap_route_error(const struct tap_route_model *m);

/* What a publish met. */
enum tap_route_outcome {
	TAP_ROUTE_OK,           /* queues[] (possibly none) */
	TAP_ROUTE_NO_VHOST,     /* the vhost is not in the model */
	TAP_ROUTE_NO_EXCHANGE,  /* the broker closes the channel with 404 */
	TAP_ROUTE_INTERNAL,     /* published to an internal exchange: refused (403) */
	TAP_ROUTE_UNKNOWN_TYPE, /* an exchange of another type was on the way: not judged */
};

struct tap_route_msg {
	const char *vhost, *exchange, *key;
	size_t vhost_len, exchange_len, key_len;
	const struct tap_route_field *headers; /* the publish's headers, NULL when it has none */
	size_t n_headers;
};

struct tap_route_result {
	enum tap_route_outcome outcome;
	bool alternate; /* an alternate exchange was followed */
	uint32_t n_queues;
	const uint32_t *queues; /* queue ids, in no order; valid until the next tap_route on the model */
};

/* One binding considered by tap_route_explain. */
struct tap_route_why {
	const char *exchange;
	size_t exchange_len;
	enum tap_route_xtype type;
	const char *key; /* the binding's key */
	size_t key_len;
	bool to_exchange;
	const char *dest;
	size_t dest_len;
	bool matched;
	const char *reason;    /* why it matched or not, one line */
	const char *alternate; /* non-NULL (len in key_len is 0): this is the exchange's alternate, taken */
	size_t alternate_len;
};

typedef void (*tap_route_why_fn)(void *arg, const struct tap_route_why *w);

/* Routes msg as RabbitMQ does (rabbit_exchange:route/2): each exchange visited once, each queue counted once, an
 * exchange's alternate tried when its own bindings match nothing. Returns 0 (r filled) or TAP_E_NOMEM (no memory
 * for a header table's sort). */
int tap_route(struct tap_route_model *m, const struct tap_route_msg *msg, struct tap_route_result *r);
/* The same, calling why for every binding of every exchange visited (and every alternate followed). */
int tap_route_explain(struct tap_route_model *m, const struct tap_route_msg *msg, struct tap_route_result *r,
                      tap_route_why_fn why, void *arg);

const char *tap_route_queue_name(const struct tap_route_model *m, uint32_t q, size_t *len);
const char *tap_route_outcome_name(enum tap_route_outcome o);

/* Counts, for reports. */
struct tap_route_counts {
	uint32_t vhosts, exchanges, queues, bindings, policies, unknown_type;
};
void tap_route_counts(const struct tap_route_model *m, struct tap_route_counts *c);

/* Whether a topic binding key matches a routing key, the slow way (one word list against the other), and why not
 * in reason ("3 words against 4"). The trie of tap_route gives the same answer; tests hold one against the other. */
bool tap_route_topic_match(const char *bkey, size_t blen, const char *rkey, size_t rlen, char *reason,
                           size_t reason_cap);

/* Whether a headers binding's arguments (sorted or not) match a publish's headers, as RabbitMQ's headers_match/2. */
bool tap_route_headers_match(const struct tap_route_field *args, size_t n_args, const struct tap_route_field *hdrs,
                             size_t n_hdrs, char *reason, size_t reason_cap);

#endif
