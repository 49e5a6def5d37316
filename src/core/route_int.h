/* The routing model's inside, shared by route.c (building), route_match.c (lookups) and route_explain.c. */
#ifndef AMQPTAP_ROUTE_INT_H
#define AMQPTAP_ROUTE_INT_H

#include "amqptap/route.h"

#include <regex.h>
#include <stdbool.h>
#include <stdint.h>

/* Hash table kinds: the owner of a key is (kind << 32 | id). */
enum route_kind {
	ROUTE_K_VH = 1, /* vhost names (owner 0) */
	ROUTE_K_EX,     /* exchange names in a vhost */
	ROUTE_K_Q,      /* queue names in a vhost */
	ROUTE_K_DIRECT, /* a direct exchange's binding keys -> node */
	ROUTE_K_EDGE,   /* a topic node's word -> child node */
};
#define ROUTE_K(kind, id) (((uint64_t)(kind) << 32) | (uint32_t)(id))

enum route_xmatch { ROUTE_XM_ALL, ROUTE_XM_ANY, ROUTE_XM_ALL_X, ROUTE_XM_ANY_X };

#define ROUTE_APPLY_EXCHANGES 1u
#define ROUTE_APPLY_QUEUES 2u

struct route_slot {
	uint64_t hash, owner;
	const char *s;
	uint32_t len, val; /* val TAP_ROUTE_NONE: empty */
};

struct route_vhost {
	const char *name;
	uint32_t name_len;
};

struct route_ex {
	uint32_t vhost;
	const char *name, *type_name;
	uint32_t name_len;
	enum tap_route_xtype type;
	bool internal, has_ae_arg, has_ae;
	const char *ae_arg;
	uint32_t ae_arg_len;
	const char *ae_name; /* the argument's or the policy's */
	uint32_t ae_name_len;
	uint32_t ae;        /* its id, TAP_ROUTE_NONE when none or not declared */
	uint32_t ae_policy; /* the policy that gave it (when not the argument) */
	uint32_t root;      /* topic: the trie's root node */
	uint32_t bind_head, bind_tail;
	uint32_t mark; /* == model gen: visited by this lookup */
};

struct route_queue {
	uint32_t vhost;
	const char *name;
	uint32_t name_len;
	uint32_t mark;
};

struct route_binding {
	uint32_t ex, dest;
	bool to_ex;
	uint8_t xmatch;
	const char *key;
	uint32_t key_len;
	struct tap_route_field *args; /* sorted by key (stable) */
	uint32_t n_args;
	uint32_t next_ex;   /* the exchange's bindings, in the order added */
	uint32_t next_node; /* the direct key's or trie node's bindings */
};

/* A direct exchange's key or a topic trie node; a node reached by a '#' word is_hash (it may take more words). */
struct route_node {
	uint32_t hash_child, star_child;
	uint32_t bind_head;
	uint32_t mark;
	bool is_hash;
};

struct route_policy {
	uint32_t vhost;
	const char *name;
	uint32_t name_len;
	uint8_t apply;
	int64_t priority;
	bool has_ae, re_ok;
	const char *ae;
	uint32_t ae_len;
	regex_t re;
};

struct arena_chunk;

struct tap_route_model {
	struct tap_route_limits lim;
	uint64_t bytes;
	bool broken, finished;
	char err[256];
	struct arena_chunk *chunks;
	struct route_slot *ht;
	uint32_t ht_cap, ht_used;
	struct route_vhost *vh;
	uint32_t n_vh, cap_vh;
	struct route_ex *ex;
	uint32_t n_ex, cap_ex, n_unknown;
	struct route_queue *q;
	uint32_t n_q, cap_q;
	struct route_binding *b;
	uint32_t n_b, cap_b;
	struct route_node *nodes;
	uint32_t n_nodes, cap_nodes;
	struct route_policy *pol;
	uint32_t n_pol, cap_pol;
	/* lookup scratch, sized at finish */
	uint32_t gen, stamp;
	uint32_t *work, cap_work;
	uint32_t *out, cap_out;
	uint32_t *cur, cap_cur, *nxt, cap_nxt;
	struct tap_route_field *sorted;
	uint32_t cap_sorted;
};

int route_fail(struct tap_route_model *m, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int route_grow(struct tap_route_model *m, void **p, uint32_t *cap, size_t elem, uint32_t need);
void *route_alloc(struct tap_route_model *m, size_t n);
char *route_strdup(struct tap_route_model *m, const char *s, size_t len);
uint32_t route_find(const struct tap_route_model *m, uint64_t owner, const char *s, size_t len);
int route_insert(struct tap_route_model *m, uint64_t owner, const char *s, size_t len, uint32_t val);

#endif
