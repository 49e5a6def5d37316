/* Definitions JSON into a routing model (route_defs.h). The input is checked for size and nesting before jansson
 * parses it, and jansson's allocations are counted against max_parse while it does (json_set_alloc_funcs is
 * process-wide: only this file uses jansson, on one thread at a time). Then vhosts, queues, exchanges, bindings and
 * policies in that order, so a binding's ends and an alternate's name are known when they are added. */
#include "amqptap/route_defs.h"

#include "amqptap/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tap_route_defs_limits_default(struct tap_route_defs_limits *l)
{
	l->max_input = 64u << 20;
	l->max_depth = 32;
	l->max_parse = 1024u << 20;
	tap_route_limits_default(&l->model);
}

/* --- jansson's allocations, counted ------------------------------------------------------------------------- */

static _Thread_local size_t parse_used, parse_cap;
static _Thread_local bool parse_refused;

struct hdr {
	size_t n;
	max_align_t pad[];
};

static void *counted_malloc(size_t n)
{
	if (parse_cap && (n > parse_cap || parse_used > parse_cap - n)) {
		parse_refused = true;
		return NULL;
	}
	struct hdr *h = malloc(sizeof *h + n);
	if (!h) {
		parse_refused = true;
		return NULL;
	}
	h->n = n;
	parse_used += n;
	return h->pad;
}

static void counted_free(void *p)
{
	if (!p)
		return;
	struct hdr *h = (struct hdr *)((char *)p - offsetof(struct hdr, pad));
	parse_used -= h->n;
	free(h);
}

/* The deepest nesting of arrays and objects, outside strings; past max it stops and says where. */
static bool depth_ok(const char *p, size_t len, uint32_t max, size_t *where)
{
	uint32_t d = 0;
	bool in_str = false;
	for (size_t i = 0; i < len; i++) {
		char c = p[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = false;
		} else if (c == '"') {
			in_str = true;
		} else if (c == '[' || c == '{') {
			if (++d > max) {
				*where = i;
				return false;
			}
		} else if ((c == ']' || c == '}') && d) {
			d--;
		}
	}
	return true;
}

/* --- JSON values to route values ---------------------------------------------------------------------------- */

struct tap_route_json_hold {
	struct tap_route_json_hold *next;
	max_align_t data[];
};

struct conv {
	struct tap_route_json_hold *blocks;
	bool allow_null;
	uint32_t max_depth;
	char *err;
	size_t err_cap;
};

static void *conv_alloc(struct conv *c, size_t n)
{
	struct tap_route_json_hold *b = malloc(sizeof *b + (n ? n : 1));
	if (!b)
		return NULL;
	b->next = c->blocks;
	c->blocks = b;
	return b->data;
}

void tap_route_json_free(struct tap_route_json_hold *hold)
{
	while (hold) {
		struct tap_route_json_hold *n = hold->next;
		free(hold);
		hold = n;
	}
}

static int conv_err(struct conv *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int conv_err(struct conv *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err, c->err_cap, fmt, ap);
	va_end(ap);
	return TAP_E_USAGE;
}

static int conv_fields(struct conv *c, const json_t *obj, uint32_t depth, struct tap_route_field **out, size_t *n);

static int cmp_field(const void *a, const void *b)
{
	const struct tap_route_field *x = a, *y = b;
	size_t l = x->key_len < y->key_len ? x->key_len : y->key_len;
	int r = memcmp(x->key, y->key, l);
	return r ? r : (x->key_len < y->key_len ? -1 : x->key_len > y->key_len);
}

static int conv_value(struct conv *c, const json_t *j, uint32_t depth, struct tap_route_value *v)
{
	memset(v, 0, sizeof *v);
	switch (json_typeof(j)) {
	case JSON_INTEGER:
		*v = (struct tap_route_value){.kind = TAP_RV_INT, .type = 'l', .i = (int64_t)json_integer_value(j)};
		return 0;
	case JSON_REAL:
		*v = (struct tap_route_value){.kind = TAP_RV_FLOAT, .type = 'd', .d = json_real_value(j)};
		return 0;
	case JSON_TRUE:
	case JSON_FALSE:
		*v = (struct tap_route_value){.kind = TAP_RV_BOOL, .type = 't', .b = json_is_true(j)};
		return 0;
	case JSON_STRING:
		*v = (struct tap_route_value){
		    .kind = TAP_RV_STR, .type = 'S', .s = json_string_value(j), .len = (uint32_t)json_string_length(j)};
		return 0;
	case JSON_NULL:
		if (!c->allow_null)
			return conv_err(c, "null is not a value RabbitMQ takes in arguments");
		*v = (struct tap_route_value){.kind = TAP_RV_VOID, .type = 'V'};
		return 0;
	case JSON_ARRAY: {
		if (depth >= c->max_depth)
			return conv_err(c, "values nested deeper than %u", c->max_depth);
		size_t n = json_array_size(j);
		struct tap_route_value *items = conv_alloc(c, n * sizeof *items);
		if (!items)
			return TAP_E_NOMEM;
		for (size_t i = 0; i < n; i++) {
			int rc = conv_value(c, json_array_get(j, i), depth + 1, &items[i]);
			if (rc)
				return rc;
		}
		*v = (struct tap_route_value){.kind = TAP_RV_ARRAY, .type = 'A', .items = items, .len = (uint32_t)n};
		return 0;
	}
	case JSON_OBJECT: {
		if (depth >= c->max_depth)
			return conv_err(c, "values nested deeper than %u", c->max_depth);
		struct tap_route_field *f;
		size_t n;
		int rc = conv_fields(c, j, depth + 1, &f, &n);
		if (rc)
			return rc;
		/* RabbitMQ makes a table of a JSON object through an Erlang map: keys in term order */
		qsort(f, n, sizeof *f, cmp_field);
		*v = (struct tap_route_value){.kind = TAP_RV_TABLE, .type = 'F', .fields = f, .len = (uint32_t)n};
		return 0;
	}
	}
	return conv_err(c, "unexpected JSON value");
}

static int conv_fields(struct conv *c, const json_t *obj, uint32_t depth, struct tap_route_field **out, size_t *n)
{
	size_t cnt = json_object_size(obj);
	struct tap_route_field *f = conv_alloc(c, cnt * sizeof *f);
	if (!f)
		return TAP_E_NOMEM;
	size_t i = 0;
	const char *key;
	json_t *val;
	json_object_foreach((json_t *)obj, key, val)
	{
		f[i].key = key;
		f[i].key_len = (uint32_t)strlen(key);
		int rc = conv_value(c, val, depth, &f[i].v);
		if (rc)
			return rc;
		i++;
	}
	*out = f;
	*n = i;
	return 0;
}

int tap_route_json_fields(const json_t *obj, bool allow_null, uint32_t max_depth, struct tap_route_json_hold **hold,
                          const struct tap_route_field **fields, size_t *n, char *err, size_t err_cap)
{
	struct conv c = {.allow_null = allow_null, .max_depth = max_depth, .err = err, .err_cap = err_cap};
	*hold = NULL;
	*fields = NULL;
	*n = 0;
	if (!obj || json_is_null(obj))
		return 0;
	if (!json_is_object(obj)) {
		snprintf(err, err_cap, "not a JSON object");
		return TAP_E_USAGE;
	}
	struct tap_route_field *f;
	int rc = conv_fields(&c, obj, 1, &f, n);
	if (rc) {
		if (rc == TAP_E_NOMEM)
			snprintf(err, err_cap, "out of memory");
		tap_route_json_free(c.blocks);
		return rc;
	}
	*hold = c.blocks;
	*fields = f;
	return 0;
}

/* --- the definitions ---------------------------------------------------------------------------------------- */

struct load {
	struct tap_route_model *m;
	const char *vhost;
	char *err;
	size_t err_cap;
	uint32_t max_depth;
};

static int fail(struct load *l, const char *sect, size_t i, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(struct load *l, const char *sect, size_t i, const char *fmt, ...)
{
	char what[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	snprintf(l->err, l->err_cap, "%s[%zu]: %s", sect, i, what);
	return TAP_E_USAGE;
}

/* A string member: its bytes and length, or def when absent (NULL def: required). */
static bool get_str(const json_t *o, const char *k, const char *def, const char **s, size_t *len)
{
	const json_t *v = json_object_get(o, k);
	if (!v) {
		if (!def)
			return false;
		*s = def;
		*len = strlen(def);
		return true;
	}
	if (!json_is_string(v))
		return false;
	*s = json_string_value(v);
	*len = json_string_length(v);
	return true;
}

static const json_t *section(const json_t *root, const char *name)
{
	const json_t *a = json_object_get(root, name);
	return json_is_array(a) ? a : NULL;
}

static int model_rc(struct load *l, const char *sect, size_t i, int rc)
{
	return rc ? fail(l, sect, i, "%s", tap_route_error(l->m)) : 0;
}

static int load_vhosts(struct load *l, const json_t *root)
{
	const json_t *a = section(root, "vhosts"), *o;
	size_t i;
	json_array_foreach(a, i, o)
	{
		const char *n;
		size_t nl;
		if (!get_str(o, "name", NULL, &n, &nl))
			return fail(l, "vhosts", i, "no \"name\" string");
		if (model_rc(l, "vhosts", i, tap_route_add_vhost(l->m, n, nl)))
			return TAP_E_USAGE;
	}
	return 0;
}

static int load_queues(struct load *l, const json_t *root)
{
	const json_t *a = section(root, "queues"), *o;
	size_t i;
	json_array_foreach(a, i, o)
	{
		const char *n, *vh;
		size_t nl, vl;
		if (!get_str(o, "name", NULL, &n, &nl) || !get_str(o, "vhost", l->vhost, &vh, &vl))
			return fail(l, "queues", i, "no \"name\" or \"vhost\" string");
		if (model_rc(l, "queues", i, tap_route_add_queue(l->m, vh, vl, n, nl)))
			return TAP_E_USAGE;
	}
	return 0;
}

static int load_exchanges(struct load *l, const json_t *root)
{
	const json_t *a = section(root, "exchanges"), *o;
	size_t i;
	json_array_foreach(a, i, o)
	{
		const char *n, *vh, *t, *ae = NULL;
		size_t nl, vl, tl, al = 0;
		if (!get_str(o, "name", NULL, &n, &nl) || !get_str(o, "vhost", l->vhost, &vh, &vl) ||
		    !get_str(o, "type", NULL, &t, &tl))
			return fail(l, "exchanges", i, "no \"name\", \"vhost\" or \"type\" string");
		const json_t *args = json_object_get(o, "arguments");
		const json_t *aej = json_is_object(args) ? json_object_get(args, "alternate-exchange") : NULL;
		if (json_is_string(aej)) {
			ae = json_string_value(aej);
			al = json_string_length(aej);
		}
		if (model_rc(l, "exchanges", i,
		             tap_route_add_exchange(l->m, vh, vl, n, nl, t, tl,
		                                    json_is_true(json_object_get(o, "internal")), ae, al)))
			return TAP_E_USAGE;
	}
	return 0;
}

/* rabbitmqctl export_definitions leaves internal exchanges out (and writes no "internal" member) but keeps their
 * bindings: an exchange a binding names that is not declared is such a one. It is added as one the model does not
 * know (TAP_ROUTE_OMITTED), internal, so that a publish whose route meets it is not judged rather than judged wrong.
 * In such an export an undeclared alternate exchange may be one too, and is taken the same way; where every
 * exchange has its "internal" member (the management API's export), an undeclared alternate is missing. */
static int add_omitted_one(struct load *l, const char *sect, size_t i, const json_t *o, const char *k,
			   const char *vh, size_t vl)
{
	const json_t *v = json_object_get(o, k);
	if (!json_is_string(v) || !json_string_length(v))
		return 0;
	return model_rc(l, sect, i,
			tap_route_add_exchange(l->m, vh, vl, json_string_value(v), json_string_length(v), TAP_ROUTE_OMITTED,
					       strlen(TAP_ROUTE_OMITTED), true, NULL, 0));
}

static int add_omitted(struct load *l, const json_t *root)
{
	const json_t *a = section(root, "exchanges"), *o;
	size_t i;
	bool omits = false;
	json_array_foreach(a, i, o) omits |= !json_object_get(o, "internal");
	const char *vh;
	size_t vl;
	a = section(root, "bindings");
	json_array_foreach(a, i, o)
	{
		const json_t *dt = json_object_get(o, "destination_type");
		if (!get_str(o, "vhost", l->vhost, &vh, &vl))
			continue;
		if (add_omitted_one(l, "bindings", i, o, "source", vh, vl) ||
		    (json_is_string(dt) && !strcmp(json_string_value(dt), "exchange") &&
		     add_omitted_one(l, "bindings", i, o, "destination", vh, vl)))
			return TAP_E_USAGE;
	}
	if (!omits)
		return 0;
	a = section(root, "exchanges");
	json_array_foreach(a, i, o)
	{
		const json_t *args = json_object_get(o, "arguments");
		if (get_str(o, "vhost", l->vhost, &vh, &vl) && json_is_object(args) &&
		    add_omitted_one(l, "exchanges", i, args, "alternate-exchange", vh, vl))
			return TAP_E_USAGE;
	}
	a = section(root, "policies");
	json_array_foreach(a, i, o)
	{
		const json_t *def = json_object_get(o, "definition");
		if (get_str(o, "vhost", l->vhost, &vh, &vl) && json_is_object(def) &&
		    add_omitted_one(l, "policies", i, def, "alternate-exchange", vh, vl))
			return TAP_E_USAGE;
	}
	return 0;
}

static int load_bindings(struct load *l, const json_t *root)
{
	const json_t *a = section(root, "bindings"), *o;
	size_t i;
	json_array_foreach(a, i, o)
	{
		const char *src, *vh, *dst, *dt, *key;
		size_t sl, vl, dl, dtl, kl;
		if (!get_str(o, "source", NULL, &src, &sl) || !get_str(o, "vhost", l->vhost, &vh, &vl) ||
		    !get_str(o, "destination", NULL, &dst, &dl) || !get_str(o, "destination_type", NULL, &dt, &dtl) ||
		    !get_str(o, "routing_key", "", &key, &kl))
			return fail(l, "bindings", i, "no \"source\", \"destination\", \"destination_type\" string");
		bool to_ex = !strcmp(dt, "exchange");
		if (!to_ex && strcmp(dt, "queue"))
			return fail(l, "bindings", i, "destination_type '%.40s'", dt);
		struct tap_route_json_hold *hold;
		const struct tap_route_field *f;
		size_t nf;
		char why[200];
		int rc = tap_route_json_fields(json_object_get(o, "arguments"), false, l->max_depth, &hold, &f, &nf,
		                               why, sizeof why);
		if (rc)
			return fail(l, "bindings", i, "arguments: %s", why);
		if (sl == 0) {
			/* the default exchange's implicit bindings: nothing to add */
			tap_route_json_free(hold);
			continue;
		}
		rc = tap_route_add_binding(l->m, vh, vl, src, sl, to_ex, dst, dl, key, kl, f, nf);
		tap_route_json_free(hold);
		if (model_rc(l, "bindings", i, rc))
			return TAP_E_USAGE;
	}
	return 0;
}

static int load_policies(struct load *l, const json_t *root)
{
	const json_t *a = section(root, "policies"), *o;
	size_t i;
	json_array_foreach(a, i, o)
	{
		const char *n, *vh, *pat, *apply, *ae = NULL;
		size_t nl, vl, pl, al, ael = 0;
		if (!get_str(o, "name", NULL, &n, &nl) || !get_str(o, "vhost", l->vhost, &vh, &vl) ||
		    !get_str(o, "pattern", NULL, &pat, &pl) || !get_str(o, "apply-to", "all", &apply, &al))
			return fail(l, "policies", i, "no \"name\", \"vhost\", \"pattern\" string");
		const json_t *pr = json_object_get(o, "priority");
		if (pr && !json_is_integer(pr))
			return fail(l, "policies", i, "\"priority\" is not an integer");
		const json_t *def = json_object_get(o, "definition");
		const json_t *aej = json_is_object(def) ? json_object_get(def, "alternate-exchange") : NULL;
		if (json_is_string(aej)) {
			ae = json_string_value(aej);
			ael = json_string_length(aej);
		}
		if (model_rc(l, "policies", i,
		             tap_route_add_policy(l->m, vh, vl, n, nl, pat, pl, apply, pr ? json_integer_value(pr) : 0,
		                                  ae, ael)))
			return TAP_E_USAGE;
	}
	return 0;
}

int tap_route_defs_load(const char *data, size_t len, const char *vhost, const struct tap_route_defs_limits *limits,
                        struct tap_route_model **out, char *err, size_t err_cap)
{
	struct tap_route_defs_limits lim;
	if (limits)
		lim = *limits;
	else
		tap_route_defs_limits_default(&lim);
	if (len > lim.max_input) {
		snprintf(err, err_cap, "definitions of %zu bytes (at most %zu)", len, lim.max_input);
		return TAP_E_FULL;
	}
	size_t where;
	if (!depth_ok(data, len, lim.max_depth, &where)) {
		snprintf(err, err_cap, "definitions nested deeper than %u levels (at byte %zu)", lim.max_depth, where);
		return TAP_E_FULL;
	}
	json_error_t je;
	json_malloc_t old_m;
	json_free_t old_f;
	json_get_alloc_funcs(&old_m, &old_f);
	json_set_alloc_funcs(counted_malloc, counted_free);
	parse_used = 0;
	parse_refused = false;
	parse_cap = lim.max_parse;
	json_t *root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
	int rc = 0;
	if (!root) {
		if (parse_refused)
			snprintf(err, err_cap, "definitions take more than %zu bytes to parse", lim.max_parse);
		else
			snprintf(err, err_cap, "definitions: line %d column %d: %s", je.line, je.column, je.text);
		rc = TAP_E_USAGE;
		goto out;
	}
	if (!json_is_object(root)) {
		snprintf(err, err_cap, "definitions: not a JSON object");
		rc = TAP_E_USAGE;
		goto out;
	}
	struct load l = {
	    .vhost = vhost ? vhost : "/", .err = err, .err_cap = err_cap, .max_depth = lim.model.max_depth};
	if (!(l.m = tap_route_model_new(&lim.model))) {
		snprintf(err, err_cap, "out of memory");
		rc = TAP_E_NOMEM;
		goto out;
	}
	if ((rc = load_vhosts(&l, root)) || (rc = load_queues(&l, root)) || (rc = load_exchanges(&l, root)) ||
	    (rc = add_omitted(&l, root)) ||
	    (rc = load_bindings(&l, root)) || (rc = load_policies(&l, root))) {
		tap_route_model_free(l.m);
		goto out;
	}
	if (tap_route_finish(l.m)) {
		snprintf(err, err_cap, "definitions: %s", tap_route_error(l.m));
		tap_route_model_free(l.m);
		rc = TAP_E_USAGE;
		goto out;
	}
	*out = l.m;
out:
	json_decref(root);
	json_set_alloc_funcs(old_m, old_f);
	parse_cap = 0;
	return rc;
}
