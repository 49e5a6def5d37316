/* Which fault rule selects a publish or a connection (fault_int.h): the selectors of a rule (connection by id,
 * client address, user, vhost, connection_name; channel, exchange, routing key; after, every, times, probability from
 * the rule's seed; for a duration), matched against what the rewriter learnt of the connection, and each rule's
 * count of the publishes it matched on it. */
#include "fault_int.h"

#include <string.h>

struct ctr *fault_counter(struct tap_fault_conn *fc, uint32_t id)
{
	struct ctr *free_slot = NULL;
	for (size_t i = 0; i < TAP_FAULT_RULES_MAX; i++) {
		if (fc->ctr[i].id == id)
			return &fc->ctr[i];
		bool live = false; /* a slot of a rule removed since is free again */
		for (size_t k = 0; k < fc->set->n && !live; k++)
			live = fc->set->rules[k].id == fc->ctr[i].id;
		if (!free_slot && (fc->ctr[i].id == 0 || !live))
			free_slot = &fc->ctr[i];
	}
	if (free_slot)
		*free_slot = (struct ctr){.id = id};
	return free_slot;
}

/* The client's address without its port ("1.2.3.4:5" -> "1.2.3.4", "[::1]:5" -> "::1"). */
static bool client_matches(const char *client, const char *want)
{
	if (strcmp(client, want) == 0)
		return true;
	const char *colon = strrchr(client, ':');
	if (!colon)
		return false;
	const char *ip = client;
	size_t len = (size_t)(colon - client);
	if (*ip == '[' && len >= 2 && ip[len - 1] == ']') {
		ip++;
		len -= 2;
	}
	return strlen(want) == len && memcmp(ip, want, len) == 0;
}

static bool str_is(const char *want, const uint8_t *s, size_t len)
{
	return strlen(want) == len && memcmp(want, s, len) == 0;
}

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* Whether the connection-wide selectors of r match (they are known once the client logged in and opened). */
static bool conn_matches(const struct tap_fault_conn *fc, const struct tap_fault_rule *r)
{
	return (!r->conn || r->conn == fc->id) && (!r->client[0] || client_matches(fc->client, r->client)) &&
	       (!r->user[0] || strcmp(r->user, fc->user) == 0) && (!r->vhost[0] || strcmp(r->vhost, fc->vhost) == 0) &&
	       (!r->name[0] || strcmp(r->name, fc->name) == 0);
}

/* The first rule in force that selects this publish, or -1. Each rule counts the publishes it matches on the
 * connection (after, every); a publish another rule took first is not counted by the later ones. */
int fault_select_rule(struct tap_fault_conn *fc, const struct fchan *c, const uint8_t *ex, size_t ex_len,
		      const uint8_t *rk, size_t rk_len)
{
	struct tap_fault_set *set = fc->set;
	for (size_t i = 0; i < set->n; i++) {
		const struct tap_fault_rule *r = &set->rules[i];
		if (r->action != TAP_FAULT_NACK && r->action != TAP_FAULT_WITHHOLD && r->action != TAP_FAULT_DELAY &&
		    r->action != TAP_FAULT_KILL && r->action != TAP_FAULT_BLOCK)
			continue; /* not selected by publish */
		if (r->for_ms && fc->now - set->added_us[i] >= (int64_t)r->for_ms * 1000)
			continue;
		if (!conn_matches(fc, r) || (r->has_channel && r->channel != c->id) ||
		    (r->has_exchange && !str_is(r->exchange, ex, ex_len)) ||
		    (r->has_routing_key && !str_is(r->routing_key, rk, rk_len)))
			continue;
		bool needs_confirm = r->action == TAP_FAULT_NACK || r->action == TAP_FAULT_WITHHOLD ||
				     r->action == TAP_FAULT_DELAY;
		if (needs_confirm && !c->confirm)
			continue; /* a confirm fault on a channel without confirms has nothing to act on */
		struct ctr *k = fault_counter(fc, r->id);
		if (!k)
			continue;
		uint64_t n = ++k->seen;
		if (n <= r->after)
			continue;
		if (r->every && (n - r->after) % r->every != 0)
			continue;
		uint64_t times = r->action == TAP_FAULT_KILL ? 1 : r->times;
		if (times && k->acts >= times)
			continue;
		if (r->p > 0.0 && (double)(xorshift(&set->rng[i]) >> 11) * 0x1p-53 >= r->p)
			continue;
		k->acts++;
		return (int)i;
	}
	return -1;
}

/* The stall-heartbeats rule in force for this connection, or NULL. It acts (one fault record) at the first heartbeat
 * it keeps from the client. */
const struct tap_fault_rule *fault_stall_rule(struct tap_fault_conn *fc)
{
	struct tap_fault_set *set = fc->set;
	for (size_t i = 0; i < set->n; i++) {
		const struct tap_fault_rule *r = &set->rules[i];
		if (r->action != TAP_FAULT_STALL_HEARTBEATS || !conn_matches(fc, r))
			continue;
		if (r->for_ms && fc->now - set->added_us[i] >= (int64_t)r->for_ms * 1000)
			continue;
		return r;
	}
	return NULL;
}

/* The first rule of action a (latency, bandwidth) in force for this connection whose dir= covers dir, or NULL.
 * A user=, vhost= or name= selector matches once the client said it (start-ok, connection.open): the bytes before
 * go unharmed. */
const struct tap_fault_rule *fault_way_rule(struct tap_fault_conn *fc, enum tap_fault_action a, enum tap_dir dir)
{
	struct tap_fault_set *set = fc->set;
	enum tap_fault_way own = dir == TAP_C2S ? TAP_FAULT_UP : TAP_FAULT_DOWN;
	for (size_t i = 0; i < set->n; i++) {
		const struct tap_fault_rule *r = &set->rules[i];
		if (r->action != a || (r->way != TAP_FAULT_BOTH && r->way != own) || !conn_matches(fc, r))
			continue;
		if (r->for_ms && fc->now - set->added_us[i] >= (int64_t)r->for_ms * 1000)
			continue;
		return r;
	}
	return NULL;
}
