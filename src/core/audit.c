/* amqptap audit's reckoning (include/amqptap/audit.h, src/DESIGN.md §4b).
 *
 * Order: each file is written in the order its records were settled ("ts"); the caller merges the files by "ts"
 * (the line fed next is the earliest of the files' next lines) and the attempts of one identity are put in the order
 * of their "published" times: an attempt that arrives with an earlier "published" than the one kept is taken as the
 * earlier attempt. The clock of the audit is the latest "ts" given.
 *
 * Memory: one entry per identity within the window of that clock: an identity whose latest attempt was answered is
 * forgotten a window (and AUDIT_LATE_US) after it was published; one that ended unknown is kept until an attempt
 * resolves it, or until then (missing): a resend must be published within the window, as the tap's
 * --resend-window. 40 bytes an identity in a table at most 3/4 full (and the old table beside the new one while it
 * doubles), plus its message_id (at most 255 bytes) while unresolved: what the audit holds grows with the publish
 * rate times the window (50,000 publishes a second: about 3.5 million identities, 190-380 MB), never with the length
 * of the files; a shorter window holds less. Per application and exchange a row of counts (at most
 * TAP_AUDIT_GROUPS_MAX of each, the rest "(other)"); per open connection its name (at most TAP_AUDIT_CONNS_MAX). */
#include "amqptap/audit.h"

#include "amqptap/hist.h"
#include "amqptap/identity.h"
#include "amqptap/status.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

/* A record is written when its verdict is settled, after its publish: an attempt published within the window is
 * still taken when its record comes up to this much later (a confirm that slow is rare). */
#define AUDIT_LATE_US 10000000LL

/* ---- what is counted ---- */

struct counts {
	uint64_t publishes, unknown, resent, duplicates, missing, unverified;
	struct tap_hist delay; /* resend delay, µs */
};

struct group {
	char *name;
	struct counts k;
};

struct groups {
	struct group *g;
	size_t n, cap;
	struct group other;
};

/* ---- the identities ---- */

enum outcome {
	OUT_ANSWERED,   /* acked or routed: a later attempt is a duplicate */
	OUT_UNRESOLVED, /* unknown: a later attempt is its resend */
	OUT_OTHER,      /* nacked or returned (a resend is right, none is asked for), or unverified */
};

/* 40 bytes: the table holds one per identity of the window (at most 4/3 of them as slots). */
struct ident {
	uint64_t key;
	int64_t published; /* of the attempt kept; it is due a window (and AUDIT_LATE_US) after */
	char *message_id;  /* unresolved only */
	uint32_t prev, next; /* deadline list, index + 1 */
	uint16_t app, exch;  /* group indexes + 1 (0: other) of the attempt kept */
	uint8_t outcome, kind;
	bool used;
};
_Static_assert(sizeof(struct ident) == 40, "keep the audit's identities compact");

struct tap_audit {
	struct ident *tab;
	size_t cap, n;
	uint32_t head, tail; /* every entry, by deadline */
	int64_t window_us, clock;
	struct counts total;
	struct groups apps, exchs;
	char *missing_ids[TAP_AUDIT_MISSING_IDS];
	size_t n_missing_ids;
	uint64_t lines, bad_lines, no_identity, conns_untracked;
	/* connection_name (else product) of each open connection, by a hash of (run, conn), forgotten at its close: open
	 * addressing as the identities, at most TAP_AUDIT_CONNS_MAX */
	struct connname {
		uint64_t key;
		char *name; /* NULL: a free slot */
	} *conns;
	size_t n_conns, cap_conns;
	size_t peak_entries;
	bool oom; /* something could not be kept: the audit is incomplete */
};

/* Allocation failures end the audit's count: it is marked incomplete (tap_audit_line then says so) and what could
 * not be kept is left out, the tables staying consistent. */
static void *grow_array(struct tap_audit *a, void *p, size_t *cap, size_t first, size_t size)
{
	size_t n = *cap ? *cap * 2 : first;
	void *q = realloc(p, n * size);
	if (!q) {
		a->oom = true;
		return NULL;
	}
	*cap = n;
	return q;
}

static char *dup_str(struct tap_audit *a, const char *s, size_t max)
{
	char *d = strndup(s, max);
	if (!d)
		a->oom = true;
	return d;
}

static struct counts *group_counts(struct groups *gs, uint16_t idx)
{
	return idx ? &gs->g[idx - 1].k : &gs->other.k;
}

/* The group of name: index + 1, or 0 for "(other)" once TAP_AUDIT_GROUPS_MAX are taken. */
static uint16_t group_of(struct tap_audit *a, struct groups *gs, const char *name)
{
	for (size_t i = 0; i < gs->n; i++) /* a few applications and exchanges: a scan is enough */
		if (!strcmp(gs->g[i].name, name))
			return (uint16_t)(i + 1);
	if (gs->n == TAP_AUDIT_GROUPS_MAX)
		return 0;
	if (gs->n == gs->cap) {
		struct group *g = grow_array(a, gs->g, &gs->cap, 16, sizeof *g);
		if (!g)
			return 0;
		gs->g = g;
	}
	char *copy = dup_str(a, name, 4096);
	if (!copy)
		return 0;
	gs->g[gs->n] = (struct group){.name = copy};
	return (uint16_t)++gs->n;
}

static struct ident *at(struct tap_audit *a, uint32_t i1)
{
	return &a->tab[i1 - 1];
}

static int64_t due_of(const struct tap_audit *a, const struct ident *e)
{
	return e->published + a->window_us + AUDIT_LATE_US;
}

static void list_unlink(struct tap_audit *a, uint32_t i1)
{
	struct ident *e = at(a, i1);
	if (e->prev)
		at(a, e->prev)->next = e->next;
	else
		a->head = e->next;
	if (e->next)
		at(a, e->next)->prev = e->prev;
	else
		a->tail = e->prev;
	e->prev = e->next = 0;
}

/* At the tail: the list is in the order identities were last seen, which is their deadlines' order as long as each
 * file comes in time order (a file written backwards is held whole: nothing at the head is due before its end). */
static void list_insert(struct tap_audit *a, uint32_t i1)
{
	struct ident *e = at(a, i1);
	e->prev = a->tail;
	e->next = 0;
	if (a->tail)
		at(a, a->tail)->next = i1;
	else
		a->head = i1;
	a->tail = i1;
}

static bool grow(struct tap_audit *a);

/* The entry of key (index + 1); made (unused) when new. 0 when there is no room for a new one (out of memory). */
static uint32_t lookup(struct tap_audit *a, uint64_t key, bool *found)
{
	if (a->n * 4 >= a->cap * 3 && !grow(a) && a->n + 1 >= a->cap) /* three quarters full at most */
		return 0;
	size_t mask = a->cap - 1;
	for (size_t i = key & mask;; i = (i + 1) & mask) {
		if (!a->tab[i].used) {
			*found = false;
			a->tab[i] = (struct ident){.key = key, .used = true};
			a->n++;
			if (a->n > a->peak_entries)
				a->peak_entries = a->n;
			return (uint32_t)i + 1;
		}
		if (a->tab[i].key == key) {
			*found = true;
			return (uint32_t)i + 1;
		}
	}
}

/* Open addressing with deletion by moving entries back: the list links move with them. */
static void relink(struct tap_audit *a, uint32_t from, uint32_t to)
{
	struct ident *e = at(a, to);
	if (e->prev)
		at(a, e->prev)->next = to;
	else if (a->head == from)
		a->head = to;
	if (e->next)
		at(a, e->next)->prev = to;
	else if (a->tail == from)
		a->tail = to;
}

static void forget(struct tap_audit *a, uint32_t i1)
{
	list_unlink(a, i1);
	free(at(a, i1)->message_id);
	size_t mask = a->cap - 1, i = i1 - 1;
	a->tab[i].used = false;
	a->n--;
	for (size_t j = (i + 1) & mask; a->tab[j].used; j = (j + 1) & mask) {
		size_t home = a->tab[j].key & mask;
		bool stays = i <= j ? home > i && home <= j : home > i || home <= j;
		if (!stays) {
			a->tab[i] = a->tab[j];
			a->tab[j].used = false;
			relink(a, (uint32_t)j + 1, (uint32_t)i + 1);
			i = j;
		}
	}
}

/* The table at twice its size, its entries placed anew; false (the table as it was) without memory. */
static bool grow(struct tap_audit *a)
{
	struct ident *old = a->tab;
	uint32_t walk = a->head;
	size_t cap = a->cap ? a->cap * 2 : 1024;
	struct ident *tab = calloc(cap, sizeof *tab);
	if (!tab) {
		a->oom = true;
		return false;
	}
	a->tab = tab;
	a->cap = cap;
	a->n = 0;
	a->head = a->tail = 0;
	while (walk) { /* in deadline order, so the list is rebuilt by appending */
		struct ident e = old[walk - 1];
		walk = e.next;
		bool found;
		uint32_t i1 = lookup(a, e.key, &found);
		e.prev = e.next = 0;
		*at(a, i1) = e;
		at(a, i1)->prev = a->tail;
		if (a->tail)
			at(a, a->tail)->next = i1;
		else
			a->head = i1;
		a->tail = i1;
	}
	free(old);
	return true;
}

static void count_missing(struct tap_audit *a, struct ident *e, const char *identity_text)
{
	a->total.missing++;
	group_counts(&a->apps, e->app)->missing++;
	group_counts(&a->exchs, e->exch)->missing++;
	if (a->n_missing_ids < TAP_AUDIT_MISSING_IDS) {
		char *name = dup_str(a, e->message_id ? e->message_id : identity_text, 255);
		if (name)
			a->missing_ids[a->n_missing_ids++] = name;
	}
}

/* Everything due by the clock: unresolved ones are missing, answered ones forgotten. */
static void expire(struct tap_audit *a, int64_t clock, bool all)
{
	while (a->head && (all || due_of(a, at(a, a->head)) <= clock)) {
		struct ident *e = at(a, a->head);
		if (e->outcome == OUT_UNRESOLVED) {
			char text[TAP_IDENTITY_TEXT_LEN + 1];
			tap_identity_format(text, (enum tap_identity_kind)e->kind, e->key);
			count_missing(a, e, text);
		}
		forget(a, a->head);
	}
}

/* ---- reading records ---- */

/* "2026-11-29T12:19:46.112637Z" as Unix µs; false when it is not one. */
static bool parse_ts(const char *s, int64_t *us)
{
	struct tm tm = {0};
	int frac_len = 0;
	unsigned frac = 0;
	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%6u%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
	           &tm.tm_sec, &frac, &frac_len) != 7 ||
	    frac_len != 26 || s[26] != 'Z')
		return false;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	time_t t = timegm(&tm);
	*us = (int64_t)t * 1000000 + frac;
	return true;
}

static const char *str_of(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static enum tap_track_confirm confirm_of(const char *s)
{
	if (!s)
		return TAP_TRACK_CONFIRM_UNKNOWN;
	return !strcmp(s, "ack") ? TAP_TRACK_CONFIRM_ACK
	       : !strcmp(s, "nack") ? TAP_TRACK_CONFIRM_NACK
	       : !strcmp(s, "none") ? TAP_TRACK_CONFIRM_NONE
	                            : TAP_TRACK_CONFIRM_UNKNOWN;
}

static enum tap_track_route route_of(const char *s)
{
	if (!s)
		return TAP_TRACK_ROUTE_UNKNOWN;
	return !strcmp(s, "routed") ? TAP_TRACK_ROUTE_ROUTED
	       : !strcmp(s, "returned") ? TAP_TRACK_ROUTE_RETURNED
	       : !strcmp(s, "unproven") ? TAP_TRACK_ROUTE_UNPROVEN
	                                : TAP_TRACK_ROUTE_UNKNOWN;
}

/* (run, conn) of a record as one key: run is the tap's run id (null for a tap that has none). */
static uint64_t conn_key(json_t *o)
{
	const char *run = str_of(o, "run");
	json_t *c = json_object_get(o, "conn");
	uint64_t id = json_is_integer(c) ? (uint64_t)json_integer_value(c) : 0;
	return XXH3_64bits_withSeed(run ? run : "", run ? strlen(run) : 0, id);
}

/* The slot of key, or of the free slot where it would go. */
static size_t conn_slot(const struct tap_audit *a, uint64_t key)
{
	size_t mask = a->cap_conns - 1, i = key & mask;
	while (a->conns[i].name && a->conns[i].key != key)
		i = (i + 1) & mask;
	return i;
}

static const char *conn_name(const struct tap_audit *a, json_t *o)
{
	if (!a->n_conns)
		return "-";
	const struct connname *e = &a->conns[conn_slot(a, conn_key(o))];
	return e->name ? e->name : "-";
}

/* Forgets the connection in slot i, moving back the ones after it that would not be found past the gap. */
static void conn_forget(struct tap_audit *a, size_t i)
{
	free(a->conns[i].name);
	a->conns[i].name = NULL;
	a->n_conns--;
	size_t mask = a->cap_conns - 1;
	for (size_t j = (i + 1) & mask; a->conns[j].name; j = (j + 1) & mask) {
		size_t home = a->conns[j].key & mask;
		bool stays = i <= j ? home > i && home <= j : home > i || home <= j;
		if (!stays) {
			a->conns[i] = a->conns[j];
			a->conns[j].name = NULL;
			i = j;
		}
	}
}

static bool conns_grow(struct tap_audit *a)
{
	size_t cap = a->cap_conns ? a->cap_conns * 2 : 64;
	struct connname *old = a->conns, *tab = calloc(cap, sizeof *tab);
	if (!tab) {
		a->oom = true;
		return false;
	}
	size_t old_cap = a->cap_conns;
	a->conns = tab;
	a->cap_conns = cap;
	for (size_t i = 0; i < old_cap; i++)
		if (old[i].name)
			a->conns[conn_slot(a, old[i].key)] = old[i];
	free(old);
	return true;
}

static void on_connection(struct tap_audit *a, json_t *o)
{
	const char *ev = str_of(o, "event");
	if (!ev)
		return;
	uint64_t key = conn_key(o);
	if (a->n_conns) {
		size_t i = conn_slot(a, key);
		if (a->conns[i].name)
			conn_forget(a, i); /* its close, or a new run reusing the number */
	}
	if (strcmp(ev, "open"))
		return;
	if (a->n_conns == TAP_AUDIT_CONNS_MAX) {
		a->conns_untracked++; /* its publishes count under "-" */
		return;
	}
	if ((a->n_conns + 1) * 4 > a->cap_conns * 3 && !conns_grow(a))
		return;
	const char *name = str_of(o, "connection_name");
	if (!name)
		name = str_of(o, "product");
	char *copy = dup_str(a, name ? name : "-", 255);
	if (!copy)
		return;
	size_t i = conn_slot(a, key);
	a->conns[i] = (struct connname){key, copy};
	a->n_conns++;
}

static void count_both(struct tap_audit *a, uint16_t app, uint16_t exch, size_t field)
{
	uint64_t *t = (uint64_t *)((char *)&a->total + field);
	uint64_t *x = (uint64_t *)((char *)group_counts(&a->apps, app) + field);
	uint64_t *y = (uint64_t *)((char *)group_counts(&a->exchs, exch) + field);
	(*t)++;
	(*x)++;
	(*y)++;
}

#define COUNT(a, app, exch, f) count_both(a, app, exch, offsetof(struct counts, f))

static void on_publish(struct tap_audit *a, json_t *o)
{
	const char *exch = str_of(o, "exchange");
	uint16_t gapp = group_of(a, &a->apps, conn_name(a, o));
	uint16_t gexch = group_of(a, &a->exchs, exch ? (*exch ? exch : "(default)") : "-");
	COUNT(a, gapp, gexch, publishes);
	enum tap_track_confirm confirm = confirm_of(str_of(o, "confirm"));
	enum tap_track_route route = route_of(str_of(o, "route"));
	json_t *reason = json_object_get(o, "reason");
	bool wants = tap_identity_wants_resend(confirm, json_is_object(reason) ? str_of(reason, "by") : NULL);
	if (wants)
		COUNT(a, gapp, gexch, unknown);
	const char *published = str_of(o, "published"), *ts = str_of(o, "ts");
	int64_t pub_us;
	if (!(published && parse_ts(published, &pub_us)) && !(ts && parse_ts(ts, &pub_us)))
		pub_us = a->clock;
	/* the identity: as written, else made of the message_id (records of a tap before identities) */
	const char *text = str_of(o, "identity"), *mid = str_of(o, "message_id");
	enum tap_identity_kind kind;
	uint64_t h;
	if (!(text && tap_identity_parse(text, strlen(text), &kind, &h))) {
		if (!mid || !*mid) {
			a->no_identity++;
			if (wants) { /* nothing can link it: it counts missing, named as well as it can be */
				struct ident e = {.app = gapp, .exch = gexch};
				count_missing(a, &e, "(no identity)");
			}
			return;
		}
		kind = TAP_IDENTITY_ID;
		h = tap_identity_of_id((const uint8_t *)mid, strlen(mid));
	}
	bool found; /* the two kinds are hashed with seeds of their own: the hash alone is the key */
	uint32_t i1 = lookup(a, h, &found);
	if (!i1)
		return; /* out of memory: the audit says it is incomplete */
	struct ident *e = at(a, i1);
	enum outcome out = wants ? OUT_UNRESOLVED
	                   : tap_identity_classify(route, confirm) == TAP_REPEAT_DUPLICATE ? OUT_ANSWERED
	                                                                                   : OUT_OTHER;
	if (found) {
		list_unlink(a, i1);
		bool later = pub_us >= e->published;
		/* the earlier of the two is the previous attempt, the later the repeat */
		enum outcome prev_out = later ? (enum outcome)e->outcome : out;
		uint16_t rapp = later ? gapp : e->app, rexch = later ? gexch : e->exch;
		/* a record with no time of its own, before any record that had one, has the clock's INT64_MIN: no delay */
		bool timed = pub_us != INT64_MIN && e->published != INT64_MIN;
		int64_t delay = !timed ? 0 : later ? pub_us - e->published : e->published - pub_us;
		uint16_t papp = later ? e->app : gapp, pexch = later ? e->exch : gexch;
		if (prev_out == OUT_UNRESOLVED) {
			COUNT(a, papp, pexch, resent);
			if (timed) {
				tap_hist_add(&a->total.delay, delay);
				tap_hist_add(&group_counts(&a->apps, papp)->delay, delay);
				tap_hist_add(&group_counts(&a->exchs, pexch)->delay, delay);
			}
		} else if (prev_out == OUT_ANSWERED) {
			COUNT(a, rapp, rexch, duplicates);
		} else {
			COUNT(a, rapp, rexch, unverified);
		}
		if (!later) { /* the one kept is the latest: it stays, resolved if it was this one's resend */
			list_insert(a, i1);
			return;
		}
		free(e->message_id);
		e->message_id = NULL;
	}
	e->published = pub_us;
	e->app = gapp;
	e->exch = gexch;
	e->outcome = (uint8_t)out;
	e->kind = (uint8_t)kind;
	if (out == OUT_UNRESOLVED && mid && *mid)
		e->message_id = dup_str(a, mid, 255);
	list_insert(a, i1);
}

static void on_line(struct tap_audit *a, const char *line, size_t len)
{
	a->lines++;
	if (len > TAP_AUDIT_LINE_MAX) {
		a->bad_lines++;
		return;
	}
	json_error_t err;
	json_t *o = json_loadb(line, len, JSON_DISABLE_EOF_CHECK, &err);
	if (!json_is_object(o)) {
		a->bad_lines++;
		json_decref(o);
		return;
	}
	const char *type = str_of(o, "type");
	if (type && !strcmp(type, "publish"))
		on_publish(a, o);
	else if (type && !strcmp(type, "connection"))
		on_connection(a, o);
	json_decref(o);
}

/* ---- output ---- */

static void fmt_us(char *out, size_t cap, uint64_t us, bool any)
{
	if (!any)
		snprintf(out, cap, "-");
	else if (us < 10000)
		snprintf(out, cap, "%" PRIu64 " us", us);
	else if (us < 10000000)
		snprintf(out, cap, "%" PRIu64 " ms", us / 1000);
	else
		snprintf(out, cap, "%.1f s", (double)us / 1e6);
}

static void row(struct tap_buf *out, const char *name, const struct counts *k)
{
	char p50[32], p99[32];
	fmt_us(p50, sizeof p50, tap_hist_quantile(&k->delay, 0.5), k->delay.n);
	fmt_us(p99, sizeof p99, tap_hist_quantile(&k->delay, 0.99), k->delay.n);
	tap_buf_printf(out, "  %-32.32s %10" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 " %8" PRIu64 " %10s %10s\n", name,
	       k->publishes, k->unknown, k->resent, k->duplicates, k->missing, p50, p99);
}

static void table(struct tap_buf *out, const char *title, const struct groups *gs)
{
	tap_buf_printf(out, "%-34s %10s %8s %8s %10s %8s %10s %10s\n", title, "publishes", "unknown", "resent", "duplicates", "missing",
	       "resend p50", "p99");
	for (size_t i = 0; i < gs->n; i++)
		row(out, gs->g[i].name, &gs->g[i].k);
	if (gs->other.k.publishes)
		row(out, "(other)", &gs->other.k);
}

static json_t *counts_json(const struct counts *k)
{
	json_t *o = json_object();
	json_object_set_new(o, "publishes", json_integer((json_int_t)k->publishes));
	json_object_set_new(o, "unknown", json_integer((json_int_t)k->unknown));
	json_object_set_new(o, "resent", json_integer((json_int_t)k->resent));
	json_object_set_new(o, "duplicates", json_integer((json_int_t)k->duplicates));
	json_object_set_new(o, "unverified", json_integer((json_int_t)k->unverified));
	json_object_set_new(o, "missing", json_integer((json_int_t)k->missing));
	json_t *d = json_object();
	json_object_set_new(d, "p50", k->delay.n ? json_integer((json_int_t)tap_hist_quantile(&k->delay, 0.5)) : json_null());
	json_object_set_new(d, "p99", k->delay.n ? json_integer((json_int_t)tap_hist_quantile(&k->delay, 0.99)) : json_null());
	json_object_set_new(o, "resend_delay_us", d);
	return o;
}

static json_t *groups_json(const struct groups *gs)
{
	json_t *arr = json_array();
	for (size_t i = 0; i <= gs->n; i++) {
		const struct group *g = i < gs->n ? &gs->g[i] : &gs->other;
		if (i == gs->n && !g->k.publishes)
			break;
		json_t *o = counts_json(&g->k);
		json_object_set_new(o, "name", json_string(i < gs->n ? g->name : "(other)"));
		json_array_append_new(arr, o);
	}
	return arr;
}

/* ---- the interface ---- */

struct tap_audit *tap_audit_new(int64_t window_us)
{
	struct tap_audit *a = calloc(1, sizeof *a);
	if (!a)
		return NULL;
	a->window_us = window_us;
	a->clock = INT64_MIN;
	return a;
}

void tap_audit_free(struct tap_audit *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->n_missing_ids; i++)
		free(a->missing_ids[i]);
	for (size_t i = 0; i < a->apps.n; i++)
		free(a->apps.g[i].name);
	for (size_t i = 0; i < a->exchs.n; i++)
		free(a->exchs.g[i].name);
	free(a->apps.g);
	free(a->exchs.g);
	for (size_t i = 0; i < a->cap_conns; i++)
		free(a->conns[i].name);
	free(a->conns);
	for (size_t i = 0; i < a->cap; i++)
		if (a->tab[i].used)
			free(a->tab[i].message_id);
	free(a->tab);
	free(a);
}

bool tap_audit_line_ts(const char *line, size_t len, int64_t *ts_us)
{
	static const char key[] = "\"ts\":\"";
	const char *ts = memmem(line, len, key, sizeof key - 1);
	if (!ts)
		return false;
	ts += sizeof key - 1;
	char text[28]; /* "2026-11-29T12:19:46.112637Z" and its NUL, where the line holds that much */
	size_t n = (size_t)(line + len - ts);
	if (n > sizeof text - 1)
		n = sizeof text - 1;
	memcpy(text, ts, n);
	text[n] = '\0';
	return parse_ts(text, ts_us);
}

void tap_audit_advance(struct tap_audit *a, int64_t ts_us)
{
	if (ts_us <= a->clock)
		return;
	a->clock = ts_us;
	expire(a, a->clock, false);
}

int tap_audit_line(struct tap_audit *a, const char *line, size_t len)
{
	if (!a->oom)
		on_line(a, line, len);
	return a->oom ? TAP_E_NOMEM : TAP_OK;
}

void tap_audit_finish(struct tap_audit *a)
{
	expire(a, a->clock, true);
}

uint64_t tap_audit_missing(const struct tap_audit *a)
{
	return a->total.missing;
}

static void report_json(const struct tap_audit *a, struct tap_buf *out)
{
	json_t *o = counts_json(&a->total);
	json_t *ids = json_array();
	for (size_t i = 0; i < a->n_missing_ids; i++)
		json_array_append_new(ids, json_string(a->missing_ids[i]));
	json_object_set_new(o, "missing_ids", ids);
	json_object_set_new(o, "by_application", groups_json(&a->apps));
	json_object_set_new(o, "by_exchange", groups_json(&a->exchs));
	json_object_set_new(o, "lines", json_integer((json_int_t)a->lines));
	json_object_set_new(o, "bad_lines", json_integer((json_int_t)a->bad_lines));
	json_object_set_new(o, "without_identity", json_integer((json_int_t)a->no_identity));
	json_object_set_new(o, "connections_untracked", json_integer((json_int_t)a->conns_untracked));
	json_object_set_new(o, "peak_identities", json_integer((json_int_t)a->peak_entries));
	json_object_set_new(o, "window_us", json_integer((json_int_t)a->window_us));
	char *text = json_dumps(o, JSON_COMPACT);
	if (text)
		tap_buf_printf(out, "%s\n", text);
	else
		out->oom = true;
	free(text);
	json_decref(o);
}

static void report_table(const struct tap_audit *a, struct tap_buf *out)
{
	table(out, "application", &a->apps);
	tap_buf_puts(out, "\n");
	table(out, "exchange", &a->exchs);
	tap_buf_puts(out, "\n");
	row(out, "total", &a->total);
	if (a->n_missing_ids) {
		tap_buf_printf(out, "\nnot resent (%" PRIu64 "%s):", a->total.missing,
			       a->total.missing > a->n_missing_ids ? ", the first 100" : "");
		for (size_t i = 0; i < a->n_missing_ids; i++)
			tap_buf_printf(out, " %s", a->missing_ids[i]);
		tap_buf_puts(out, "\n");
	}
	if (a->bad_lines)
		tap_buf_printf(out, "%" PRIu64 " lines were no JSON record and were skipped\n", a->bad_lines);
	if (a->conns_untracked)
		tap_buf_printf(out, "%" PRIu64 " connections past the first %u open at once were not named (\"-\")\n",
			       a->conns_untracked, TAP_AUDIT_CONNS_MAX);
}

void tap_audit_report(const struct tap_audit *a, enum tap_audit_form form, struct tap_buf *out)
{
	if (form == TAP_AUDIT_JSON)
		report_json(a, out);
	else
		report_table(a, out);
}
