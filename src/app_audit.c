/* amqptap audit FILE... (src/DESIGN.md §4b): the verdict files of any number of taps, sniffers and runs, in any order
 * ('-' is standard input), read together; every publish that ended unknown is linked by its identity to a later
 * attempt of any file, or counted missing. Exit 0 when every unknown was resent, 1 when one was not, 2 for a bad
 * option or input that cannot be read.
 *
 * Order: each file is written in the order its records were settled ("ts"), so the files are merged by "ts" (the
 * line read next is the earliest of the files' next lines) and the attempts of one identity are put in the order of
 * their "published" times: an attempt that arrives with an earlier "published" than the one kept is taken as the
 * earlier attempt. The clock of the audit is the latest "ts" read.
 *
 * Memory: one entry per identity within the window (--window, default the tap's 60 s) of that clock: an identity
 * whose latest attempt was answered is forgotten a window (and AUDIT_LATE_US) after it was published; one that ended
 * unknown is kept until an attempt resolves it, or until then (missing): a resend must be published within the
 * window, as the tap's --resend-window. 40 bytes an identity in a table at most 3/4 full (and the old table beside
 * the new one while it doubles), plus its message_id (at most 255 bytes) while unresolved: what the audit holds grows
 * with the publish rate times the window (50,000 publishes a second: about 3.5 million identities, 190-380 MB),
 * never with the length of the files; a shorter --window holds less. Per application and exchange a row of counts
 * (at most AUDIT_GROUPS_MAX of each, the rest "(other)"). */
#include "app.h"

#include "amqptap/hist.h"
#include "amqptap/identity.h"

#include <errno.h>
#include <stddef.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define AUDIT_GROUPS_MAX 1000u
#define AUDIT_MISSING_IDS 100u
#define AUDIT_FILES_MAX 256u
#define AUDIT_WINDOW_US_DEFAULT 60000000LL
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

struct audit {
	struct ident *tab;
	size_t cap, n;
	uint32_t head, tail; /* every entry, by deadline */
	int64_t window_us, clock;
	struct counts total;
	struct groups apps, exchs;
	char *missing_ids[AUDIT_MISSING_IDS];
	size_t n_missing_ids;
	uint64_t lines, bad_lines, no_identity;
	/* connection_name (else product) of each connection open: (run, conn) -> name, forgotten at its close */
	struct connname {
		char *key, *name;
	} *conns;
	size_t n_conns, cap_conns;
	size_t peak_entries;
};

static void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n);
	if (!q) {
		fprintf(stderr, "amqptap audit: out of memory\n");
		exit(1);
	}
	return q;
}

static char *xstrdup(const char *s)
{
	char *d = strdup(s);
	if (!d) {
		fprintf(stderr, "amqptap audit: out of memory\n");
		exit(1);
	}
	return d;
}

static struct counts *group_counts(struct groups *gs, uint16_t idx)
{
	return idx ? &gs->g[idx - 1].k : &gs->other.k;
}

/* The group of name: index + 1, or 0 for "(other)" once AUDIT_GROUPS_MAX are taken. */
static uint16_t group_of(struct groups *gs, const char *name)
{
	for (size_t i = 0; i < gs->n; i++) /* a few applications and exchanges: a scan is enough */
		if (!strcmp(gs->g[i].name, name))
			return (uint16_t)(i + 1);
	if (gs->n == AUDIT_GROUPS_MAX)
		return 0;
	if (gs->n == gs->cap) {
		gs->cap = gs->cap ? gs->cap * 2 : 16;
		gs->g = xrealloc(gs->g, gs->cap * sizeof *gs->g);
	}
	gs->g[gs->n] = (struct group){.name = xstrdup(name)};
	return (uint16_t)++gs->n;
}

static struct ident *at(struct audit *a, uint32_t i1)
{
	return &a->tab[i1 - 1];
}

static int64_t due_of(const struct audit *a, const struct ident *e)
{
	return e->published + a->window_us + AUDIT_LATE_US;
}

static void list_unlink(struct audit *a, uint32_t i1)
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
static void list_insert(struct audit *a, uint32_t i1)
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

static void grow(struct audit *a);

/* The entry of key (index + 1); made (unused) when new. */
static uint32_t lookup(struct audit *a, uint64_t key, bool *found)
{
	if (a->n * 4 >= a->cap * 3) /* three quarters full at most */
		grow(a);
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
static void relink(struct audit *a, uint32_t from, uint32_t to)
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

static void forget(struct audit *a, uint32_t i1)
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

static void grow(struct audit *a)
{
	struct ident *old = a->tab;
	size_t old_cap = a->cap;
	uint32_t walk = a->head;
	a->cap = a->cap ? a->cap * 2 : 1024;
	a->tab = calloc(a->cap, sizeof *a->tab);
	if (!a->tab) {
		fprintf(stderr, "amqptap audit: out of memory\n");
		exit(1);
	}
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
	(void)old_cap;
	free(old);
}

static void count_missing(struct audit *a, struct ident *e, const char *identity_text)
{
	a->total.missing++;
	group_counts(&a->apps, e->app)->missing++;
	group_counts(&a->exchs, e->exch)->missing++;
	if (a->n_missing_ids < AUDIT_MISSING_IDS)
		a->missing_ids[a->n_missing_ids++] = xstrdup(e->message_id ? e->message_id : identity_text);
}

/* Everything due by the clock: unresolved ones are missing, answered ones forgotten. */
static void expire(struct audit *a, int64_t clock, bool all)
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

static char *conn_key(json_t *o)
{
	const char *run = str_of(o, "run");
	json_t *c = json_object_get(o, "conn");
	char buf[64];
	snprintf(buf, sizeof buf, "%s/%" JSON_INTEGER_FORMAT, run ? run : "", json_is_integer(c) ? json_integer_value(c) : 0);
	return xstrdup(buf);
}

static const char *conn_name(struct audit *a, json_t *o)
{
	char *k = conn_key(o);
	const char *name = "-";
	for (size_t i = 0; i < a->n_conns; i++)
		if (!strcmp(a->conns[i].key, k)) {
			name = a->conns[i].name;
			break;
		}
	free(k);
	return name;
}

static void on_connection(struct audit *a, json_t *o)
{
	const char *ev = str_of(o, "event");
	if (!ev)
		return;
	char *k = conn_key(o);
	for (size_t i = 0; i < a->n_conns; i++) {
		if (strcmp(a->conns[i].key, k))
			continue;
		free(a->conns[i].key);
		free(a->conns[i].name);
		a->conns[i] = a->conns[--a->n_conns];
		break;
	}
	if (strcmp(ev, "open")) {
		free(k);
		return;
	}
	const char *name = str_of(o, "connection_name");
	if (!name)
		name = str_of(o, "product");
	if (a->n_conns == a->cap_conns) {
		a->cap_conns = a->cap_conns ? a->cap_conns * 2 : 64;
		a->conns = xrealloc(a->conns, a->cap_conns * sizeof *a->conns);
	}
	a->conns[a->n_conns++] = (struct connname){k, xstrdup(name ? name : "-")};
}

static void count_both(struct audit *a, uint16_t app, uint16_t exch, size_t field)
{
	uint64_t *t = (uint64_t *)((char *)&a->total + field);
	uint64_t *x = (uint64_t *)((char *)group_counts(&a->apps, app) + field);
	uint64_t *y = (uint64_t *)((char *)group_counts(&a->exchs, exch) + field);
	(*t)++;
	(*x)++;
	(*y)++;
}

#define COUNT(a, app, exch, f) count_both(a, app, exch, offsetof(struct counts, f))

static void on_publish(struct audit *a, json_t *o)
{
	const char *exch = str_of(o, "exchange");
	uint16_t gapp = group_of(&a->apps, conn_name(a, o));
	uint16_t gexch = group_of(&a->exchs, exch ? (*exch ? exch : "(default)") : "-");
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
		int64_t delay = later ? pub_us - e->published : e->published - pub_us;
		uint16_t papp = later ? e->app : gapp, pexch = later ? e->exch : gexch;
		if (prev_out == OUT_UNRESOLVED) {
			COUNT(a, papp, pexch, resent);
			tap_hist_add(&a->total.delay, delay);
			tap_hist_add(&group_counts(&a->apps, papp)->delay, delay);
			tap_hist_add(&group_counts(&a->exchs, pexch)->delay, delay);
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
		e->message_id = strndup(mid, 255);
	list_insert(a, i1);
}

static void on_line(struct audit *a, const char *line, size_t len)
{
	a->lines++;
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

/* ---- the files, merged by ts ---- */

struct reader {
	const char *path;
	FILE *f;
	char *line;
	size_t cap;
	ssize_t len; /* the line waiting, -1: none (the file is done) */
	int64_t ts;
};

static void reader_next(struct reader *r)
{
	r->len = getline(&r->line, &r->cap, r->f);
	if (r->len < 0)
		return;
	while (r->len && (r->line[r->len - 1] == '\n' || r->line[r->len - 1] == '\r'))
		r->line[--r->len] = '\0';
	const char *ts = strstr(r->line, "\"ts\":\"");
	if (!ts || !parse_ts(ts + 6, &r->ts))
		r->ts = INT64_MIN; /* read at once: it cannot be placed */
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

static void row(const char *name, const struct counts *k)
{
	char p50[32], p99[32];
	fmt_us(p50, sizeof p50, tap_hist_quantile(&k->delay, 0.5), k->delay.n);
	fmt_us(p99, sizeof p99, tap_hist_quantile(&k->delay, 0.99), k->delay.n);
	printf("  %-32.32s %10" PRIu64 " %8" PRIu64 " %8" PRIu64 " %10" PRIu64 " %8" PRIu64 " %10s %10s\n", name,
	       k->publishes, k->unknown, k->resent, k->duplicates, k->missing, p50, p99);
}

static void table(const char *title, const struct groups *gs)
{
	printf("%-34s %10s %8s %8s %10s %8s %10s %10s\n", title, "publishes", "unknown", "resent", "duplicates", "missing",
	       "resend p50", "p99");
	for (size_t i = 0; i < gs->n; i++)
		row(gs->g[i].name, &gs->g[i].k);
	if (gs->other.k.publishes)
		row("(other)", &gs->other.k);
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

static int usage(const char *msg, const char *arg)
{
	fprintf(stderr, "amqptap audit: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
	return 2;
}

int app_run_audit(int argc, char **argv)
{
	bool json = false;
	struct audit a = {.window_us = AUDIT_WINDOW_US_DEFAULT, .clock = INT64_MIN};
	struct reader rd[AUDIT_FILES_MAX];
	size_t n = 0;
	bool stdin_taken = false, opts_done = false;
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		if (!opts_done && !strcmp(s, "--")) {
			opts_done = true;
		} else if (!opts_done && !strcmp(s, "--json")) {
			json = true;
		} else if (!opts_done && (!strcmp(s, "--window") || !strncmp(s, "--window=", 9))) {
			const char *v = s[8] == '=' ? s + 9 : (i + 1 < argc ? argv[++i] : NULL);
			char *end;
			errno = 0;
			unsigned long long ms = v ? strtoull(v, &end, 10) : 0;
			if (!v || !*v || *end || errno || ms < 1 || ms > 24ull * 3600 * 1000)
				return usage("--window: expected MS from 1 to 86400000", v);
			a.window_us = (int64_t)ms * 1000;
		} else if (!opts_done && (!strcmp(s, "-h") || !strcmp(s, "--help"))) {
			printf("usage: amqptap audit [--json] [--window MS] FILE... ('-': standard input)\n"
			       "links every publish that ended unknown to a later attempt of the same identity in any of the\n"
			       "files (any taps, runs, order); exit 0 when every one was resent, 1 otherwise, 2 on bad input\n");
			return 0;
		} else if (!opts_done && s[0] == '-' && s[1]) {
			return usage("unknown option", s);
		} else {
			if (n == AUDIT_FILES_MAX)
				return usage("too many files (at most 256)", s);
			bool is_stdin = !strcmp(s, "-");
			if (is_stdin && stdin_taken)
				return usage("'-' given twice", NULL);
			stdin_taken |= is_stdin;
			FILE *f = is_stdin ? stdin : fopen(s, "r");
			if (!f) {
				fprintf(stderr, "amqptap audit: %s: %s\n", s, strerror(errno));
				return 2;
			}
			rd[n++] = (struct reader){.path = s, .f = f};
		}
	}
	if (!n)
		return usage("no file given (FILE..., '-' for standard input)", NULL);
	for (size_t i = 0; i < n; i++)
		reader_next(&rd[i]);
	for (;;) {
		struct reader *next = NULL;
		for (size_t i = 0; i < n; i++)
			if (rd[i].len >= 0 && (!next || rd[i].ts < next->ts))
				next = &rd[i];
		if (!next)
			break;
		if (next->ts != INT64_MIN && next->ts > a.clock) {
			a.clock = next->ts;
			expire(&a, a.clock, false);
		}
		if (next->len)
			on_line(&a, next->line, (size_t)next->len);
		reader_next(next);
	}
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		if (ferror(rd[i].f)) {
			fprintf(stderr, "amqptap audit: %s: read error\n", rd[i].path);
			rc = 2;
		}
		free(rd[i].line);
		if (rd[i].f != stdin)
			fclose(rd[i].f);
	}
	expire(&a, a.clock, true);
	if (json) {
		json_t *o = counts_json(&a.total);
		json_t *ids = json_array();
		for (size_t i = 0; i < a.n_missing_ids; i++)
			json_array_append_new(ids, json_string(a.missing_ids[i]));
		json_object_set_new(o, "missing_ids", ids);
		json_object_set_new(o, "by_application", groups_json(&a.apps));
		json_object_set_new(o, "by_exchange", groups_json(&a.exchs));
		json_object_set_new(o, "lines", json_integer((json_int_t)a.lines));
		json_object_set_new(o, "bad_lines", json_integer((json_int_t)a.bad_lines));
		json_object_set_new(o, "without_identity", json_integer((json_int_t)a.no_identity));
		json_object_set_new(o, "peak_identities", json_integer((json_int_t)a.peak_entries));
		json_object_set_new(o, "window_us", json_integer((json_int_t)a.window_us));
		char *text = json_dumps(o, JSON_COMPACT);
		if (text)
			printf("%s\n", text);
		free(text);
		json_decref(o);
	} else {
		table("application", &a.apps);
		printf("\n");
		table("exchange", &a.exchs);
		printf("\n");
		row("total", &a.total);
		if (a.n_missing_ids) {
			printf("\nnot resent (%" PRIu64 "%s):", a.total.missing, a.total.missing > a.n_missing_ids ? ", the first 100" : "");
			for (size_t i = 0; i < a.n_missing_ids; i++)
				printf(" %s", a.missing_ids[i]);
			printf("\n");
		}
		if (a.bad_lines)
			printf("%" PRIu64 " lines were no JSON record and were skipped\n", a.bad_lines);
	}
	if (rc == 0 && fflush(stdout) != 0)
		rc = 2;
	if (rc == 0)
		rc = a.total.missing ? 1 : 0;
	for (size_t i = 0; i < a.n_missing_ids; i++)
		free(a.missing_ids[i]);
	for (size_t i = 0; i < a.apps.n; i++)
		free(a.apps.g[i].name);
	for (size_t i = 0; i < a.exchs.n; i++)
		free(a.exchs.g[i].name);
	free(a.apps.g);
	free(a.exchs.g);
	for (size_t i = 0; i < a.n_conns; i++) {
		free(a.conns[i].key);
		free(a.conns[i].name);
	}
	free(a.conns);
	for (size_t i = 0; i < a.cap; i++)
		if (a.tab[i].used)
			free(a.tab[i].message_id);
	free(a.tab);
	return rc;
}
