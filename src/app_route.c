/* `amqptap route`: asks the routing model (src/core/route*.c) where a publish would go, from a definitions file or
 * the management API's /api/definitions fetched once by the proxy's poller (mgmt.h) (src/ROUTING.md). One query
 * (--exchange, --key, --header) prints the queues reached, one per line, or with --json one object; --explain says
 * which binding matched and why each other did not; --test runs a file of expected cases (JSON Lines) and exits 1 on
 * any difference. Its options are its own (a query's key and header values are any text, which the option table's
 * kinds refuse), parsed here; bad ones exit 2 naming the option, an API that cannot be read 3. */
#include "app.h"

#include "amqptap/files.h"
#include "amqptap/json.h"
#include "amqptap/mgmt.h"
#include "amqptap/route.h"
#include "amqptap/route_defs.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUTE_MAX_HEADERS 64
#define ROUTE_MAX_CASES_BYTES (64u << 20)
/* The exit code when --management could not be read (no answer, TLS, not 200 such as a 401): not a bad option (2)
 * nor a case that failed (1), so a CI job can tell "the broker was not there" from "the routing is wrong". */
#define ROUTE_EXIT_UNREACHABLE 3

struct route_opts {
	const char *definitions, *vhost, *exchange, *key, *test;
	const char *management, *credentials, *ca; /* --management URL and its --management-credentials, -ca */
	const char *headers[ROUTE_MAX_HEADERS];
	size_t n_headers;
	bool json, explain;
};

static const char route_usage[] =
    "usage: amqptap route --definitions FILE [--vhost V] --exchange X [--key K] [--header K=V|K:=JSON ...]\n"
    "                     [--json] [--explain]\n"
    "       amqptap route --definitions FILE [--vhost V] --test CASES [--json]\n"
    "       amqptap route --management URL [--management-credentials F] [--management-ca F] ... (as above)\n"
    "  --definitions FILE  RabbitMQ's definitions JSON (rabbitmqctl export_definitions, GET /api/definitions)\n"
    "  --management URL    instead: GET URL/api/definitions once (http[s]://HOST[:PORT]; https verified);\n"
    "                      exit 3 when it cannot be read (no answer, TLS, HTTP 401...)\n"
    "  --management-credentials F  a file holding USER:PASSWORD; --management-ca F  the CA for https\n"
    "  --vhost V           the vhost of the query, and of items without one (default /)\n"
    "  --exchange X        the exchange published to (\"\" is the default exchange)\n"
    "  --key K             the routing key (default \"\")\n"
    "  --header K=V        a header with a string value; K:=JSON a typed one (K:=2, K:=true, K:=[1,\"a\"])\n"
    "  --json              one JSON object: queues (sorted names), alternate, outcome\n"
    "  --explain           which binding matched, and why each other did not\n"
    "  --test CASES        JSON Lines of expected cases: {\"exchange\":X,\"key\":K,\"headers\":{..},\n"
    "                      \"queues\":[..] or \"none\"[,\"alternate\":B][,\"outcome\":O][,\"vhost\":V]}; exit 1 on "
    "any\n"
    "                      difference\n";

static int usage_err(const char *fmt, const char *arg)
{
	fprintf(stderr, "amqptap: route: ");
	fprintf(stderr, fmt, arg);
	fputc('\n', stderr);
	return 2;
}

static int parse_opts(int argc, char **argv, struct route_opts *o)
{
	enum { O_DEFS = 1, O_MGMT, O_CRED, O_CA, O_VHOST, O_EXCHANGE, O_KEY, O_HEADER, O_JSON, O_EXPLAIN, O_TEST, O_HELP };
	static const struct option longs[] = {{"definitions", required_argument, NULL, O_DEFS},
	                                      {"management", required_argument, NULL, O_MGMT},
	                                      {"management-credentials", required_argument, NULL, O_CRED},
	                                      {"management-ca", required_argument, NULL, O_CA},
	                                      {"vhost", required_argument, NULL, O_VHOST},
	                                      {"exchange", required_argument, NULL, O_EXCHANGE},
	                                      {"key", required_argument, NULL, O_KEY},
	                                      {"header", required_argument, NULL, O_HEADER},
	                                      {"json", no_argument, NULL, O_JSON},
	                                      {"explain", no_argument, NULL, O_EXPLAIN},
	                                      {"test", required_argument, NULL, O_TEST},
	                                      {"help", no_argument, NULL, O_HELP},
	                                      {NULL, 0, NULL, 0}};
	*o = (struct route_opts){.vhost = "/"};
	opterr = 0;
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
		switch (c) {
		case O_DEFS:
			o->definitions = optarg;
			break;
		case O_MGMT:
			o->management = optarg;
			break;
		case O_CRED:
			o->credentials = optarg;
			break;
		case O_CA:
			o->ca = optarg;
			break;
		case O_VHOST:
			o->vhost = optarg;
			break;
		case O_EXCHANGE:
			o->exchange = optarg;
			break;
		case O_KEY:
			o->key = optarg;
			break;
		case O_HEADER:
			if (o->n_headers == ROUTE_MAX_HEADERS)
				return usage_err("--header: more than %s", "64");
			if (!strchr(optarg, '='))
				return usage_err("--header '%s': expected KEY=VALUE or KEY:=JSON", optarg);
			o->headers[o->n_headers++] = optarg;
			break;
		case O_JSON:
			o->json = true;
			break;
		case O_EXPLAIN:
			o->explain = true;
			break;
		case O_TEST:
			o->test = optarg;
			break;
		case 'h':
		case O_HELP:
			fputs(route_usage, stdout);
			return 0;
		case ':':
			return usage_err("%s: missing its value", argv[optind - 1]);
		default:
			return usage_err("unknown option '%s' (amqptap route --help)", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_err("unexpected argument '%s'", argv[optind]);
	if (!o->definitions == !o->management)
		return usage_err(o->definitions ? "--definitions and --management: one or the other%s"
						: "missing --definitions FILE (or --management URL)%s", "");
	if (!o->management && (o->credentials || o->ca))
		return usage_err("%s goes with --management URL", o->credentials ? "--management-credentials"
									 : "--management-ca");
	if (o->test && (o->exchange || o->key || o->n_headers || o->explain))
		return usage_err("--test: runs its cases; --exchange, --key, --header and --explain go without it%s",
		                 "");
	if (!o->test && !o->exchange)
		return usage_err("missing --exchange X (or --test CASES)%s", "");
	return -1;
}

/* --- headers from the command line ------------------------------------------------------------------------- */

/* The --header values as a JSON object (*obj, the caller's to free); on a bad one, 2 with its line written. */
static int cli_headers(const struct route_opts *o, json_t **obj)
{
	*obj = json_object();
	if (!*obj)
		return usage_err("--header: out of memory%s", "");
	for (size_t i = 0; i < o->n_headers; i++) {
		const char *h = o->headers[i], *eq = strchr(h, '=');
		bool typed = eq > h && eq[-1] == ':';
		size_t kl = (size_t)(eq - h) - typed;
		char key[256];
		const char *bad = NULL;
		json_t *v = NULL;
		if (kl == 0 || kl >= sizeof key) {
			bad = "--header '%s': the key must be 1 to 255 bytes";
		} else {
			memcpy(key, h, kl);
			key[kl] = 0;
			json_error_t je;
			v = typed ? json_loads(eq + 1, JSON_DECODE_ANY, &je) : json_string(eq + 1);
			if (!v)
				bad = typed ? "--header '%s': the value after := is not JSON"
					    : "--header '%s': the value is not UTF-8 (use KEY:=\"...\" escapes)";
		}
		if (bad) {
			json_decref(*obj);
			*obj = NULL;
			return usage_err(bad, h);
		}
		json_object_set_new(*obj, key, v);
	}
	return 0;
}

/* --- results ----------------------------------------------------------------------------------------------- */

struct name {
	const char *s;
	size_t len;
};

static int cmp_name(const void *a, const void *b)
{
	const struct name *x = a, *y = b;
	int c = memcmp(x->s, y->s, x->len < y->len ? x->len : y->len);
	return c ? c : (x->len < y->len ? -1 : x->len > y->len);
}

/* The result's queue names, sorted (malloc'd; NULL when there are none or no memory: n says which). */
static struct name *sorted_names(const struct tap_route_model *m, const struct tap_route_result *r)
{
	if (!r->n_queues)
		return NULL;
	struct name *n = malloc(r->n_queues * sizeof *n);
	if (!n)
		return NULL;
	for (uint32_t i = 0; i < r->n_queues; i++)
		n[i].s = tap_route_queue_name(m, r->queues[i], &n[i].len);
	qsort(n, r->n_queues, sizeof *n, cmp_name);
	return n;
}

static const char *type_name(enum tap_route_xtype t)
{
	static const char *names[] = {"direct", "fanout", "topic", "headers", "other"};
	return names[t];
}

struct explain {
	bool json;
	struct tap_json *j;
};

static void print_why(void *arg, const struct tap_route_why *w)
{
	struct explain *e = arg;
	if (e->json) {
		struct tap_json *j = e->j;
		tap_json_obj_begin(j);
		tap_json_kv_strn(j, "exchange", w->exchange, w->exchange_len);
		tap_json_kv_str(j, "type", type_name(w->type));
		if (w->alternate) {
			tap_json_kv_strn(j, "alternate", w->alternate, w->alternate_len);
		} else {
			tap_json_kv_strn(j, "binding_key", w->key, w->key_len);
			tap_json_kv_str(j, "destination_type", w->to_exchange ? "exchange" : "queue");
			tap_json_kv_strn(j, "destination", w->dest, w->dest_len);
		}
		tap_json_kv_bool(j, "matched", w->matched);
		tap_json_kv_str(j, "reason", w->reason);
		tap_json_obj_end(j);
		return;
	}
	if (w->alternate)
		printf("exchange '%.*s' (%s): alternate exchange '%.*s' taken: %s\n", (int)w->exchange_len, w->exchange,
		       type_name(w->type), (int)w->alternate_len, w->alternate, w->reason);
	else
		printf("exchange '%.*s' (%s): binding '%.*s' -> %s '%.*s': %s: %s\n", (int)w->exchange_len, w->exchange,
		       type_name(w->type), (int)w->key_len, w->key, w->to_exchange ? "exchange" : "queue",
		       (int)w->dest_len, w->dest, w->matched ? "matches" : "no", w->reason);
}

static const char *outcome_text(enum tap_route_outcome o)
{
	switch (o) {
	case TAP_ROUTE_NO_VHOST:
		return "the vhost is not in the definitions";
	case TAP_ROUTE_NO_EXCHANGE:
		return "no such exchange: the broker closes the channel (404)";
	case TAP_ROUTE_INTERNAL:
		return "an internal exchange: the broker refuses the publish (403)";
	case TAP_ROUTE_UNKNOWN_TYPE:
		return "an exchange of a type the model does not know is on the way: not judged";
	case TAP_ROUTE_OK:
		break;
	}
	return "";
}

static int run_query(struct tap_route_model *m, const struct route_opts *o)
{
	json_t *hobj;
	int rc = cli_headers(o, &hobj);
	if (rc)
		return rc;
	struct tap_route_json_hold *hold;
	const struct tap_route_field *hf;
	size_t nh;
	char err[300];
	if (tap_route_json_fields(hobj, true, 8, &hold, &hf, &nh, err, sizeof err)) {
		json_decref(hobj);
		return usage_err("--header: %s", err);
	}
	const char *key = o->key ? o->key : "";
	struct tap_route_msg msg = {.vhost = o->vhost,
	                            .vhost_len = strlen(o->vhost),
	                            .exchange = o->exchange,
	                            .exchange_len = strlen(o->exchange),
	                            .key = key,
	                            .key_len = strlen(key),
	                            .headers = hf,
	                            .n_headers = nh};
	struct tap_route_result r;
	struct tap_buf b;
	struct tap_json j;
	tap_buf_init(&b);
	tap_json_init(&j, &b);
	struct explain ex = {.json = o->json, .j = &j};
	if (o->json) {
		tap_json_obj_begin(&j);
		if (o->explain) {
			tap_json_key(&j, "explain");
			tap_json_arr_begin(&j);
		}
	}
	rc = o->explain ? tap_route_explain(m, &msg, &r, print_why, &ex) : tap_route(m, &msg, &r);
	tap_route_json_free(hold);
	json_decref(hobj);
	if (rc) {
		fprintf(stderr, "amqptap: route: out of memory\n");
		tap_buf_deinit(&b);
		return 1;
	}
	struct name *names = sorted_names(m, &r);
	if (r.n_queues && !names) {
		fprintf(stderr, "amqptap: route: out of memory\n");
		tap_buf_deinit(&b);
		return 1;
	}
	if (o->json) {
		if (o->explain)
			tap_json_arr_end(&j);
		tap_json_kv_str(&j, "outcome", tap_route_outcome_name(r.outcome));
		tap_json_key(&j, "queues");
		tap_json_arr_begin(&j);
		for (uint32_t i = 0; i < r.n_queues; i++)
			tap_json_strn(&j, names[i].s, names[i].len);
		tap_json_arr_end(&j);
		tap_json_kv_bool(&j, "alternate", r.alternate);
		tap_json_obj_end(&j);
		tap_buf_putc(&b, '\n');
		fwrite(b.data, 1, b.len, stdout);
	} else if (r.outcome != TAP_ROUTE_OK) {
		printf("%s: %s\n", tap_route_outcome_name(r.outcome), outcome_text(r.outcome));
	} else {
		if (o->explain)
			printf("%u queue%s%s%s\n", r.n_queues, r.n_queues == 1 ? "" : "s",
			       r.alternate ? " (by an alternate exchange)" : "", r.n_queues ? ":" : "");
		for (uint32_t i = 0; i < r.n_queues; i++)
			printf("%.*s\n", (int)names[i].len, names[i].s);
	}
	free(names);
	tap_buf_deinit(&b);
	return 0;
}

/* --- --test ------------------------------------------------------------------------------------------------ */

/* The expected queues of a case: a JSON array of strings, or "none". Sorted into exp (malloc'd). */
static bool expected_queues(const json_t *q, struct name **exp, size_t *n)
{
	*exp = NULL;
	*n = 0;
	if (json_is_string(q))
		return !strcmp(json_string_value(q), "none");
	if (!json_is_array(q))
		return false;
	*n = json_array_size(q);
	if (!*n)
		return true;
	if (!(*exp = malloc(*n * sizeof **exp)))
		return false;
	for (size_t i = 0; i < *n; i++) {
		const json_t *s = json_array_get(q, i);
		if (!json_is_string(s))
			return false;
		(*exp)[i] = (struct name){json_string_value(s), json_string_length(s)};
	}
	qsort(*exp, *n, sizeof **exp, cmp_name);
	return true;
}

static void put_names(FILE *f, const struct name *n, size_t cnt)
{
	if (!cnt) {
		fputs("none", f);
		return;
	}
	fputc('[', f);
	for (size_t i = 0; i < cnt; i++)
		fprintf(f, "%s%.*s", i ? "," : "", (int)n[i].len, n[i].s);
	fputc(']', f);
}

/* One case: 0 passed, 1 differs, 2 malformed (err says why). */
static int run_case(struct tap_route_model *m, const struct route_opts *o, const json_t *c, const char *where,
                    char *err, size_t err_cap)
{
	const json_t *xj = json_object_get(c, "exchange"), *kj = json_object_get(c, "key");
	const json_t *vj = json_object_get(c, "vhost"), *qj = json_object_get(c, "queues");
	const json_t *aj = json_object_get(c, "alternate"), *oj = json_object_get(c, "outcome");
	if (!json_is_object(c) || !json_is_string(xj) || (kj && !json_is_string(kj)) || (vj && !json_is_string(vj)) ||
	    (aj && !json_is_boolean(aj)) || (oj && !json_is_string(oj)) || (!qj && !oj)) {
		snprintf(err, err_cap,
		         "a case needs \"exchange\" and \"queues\" (or \"outcome\"); \"key\", \"vhost\" "
		         "strings, \"headers\" an object, \"alternate\" a boolean");
		return 2;
	}
	struct name *exp = NULL;
	size_t n_exp = 0;
	if (qj && !expected_queues(qj, &exp, &n_exp)) {
		free(exp);
		snprintf(err, err_cap, "\"queues\" must be an array of names or \"none\"");
		return 2;
	}
	struct tap_route_json_hold *hold;
	const struct tap_route_field *hf;
	size_t nh;
	char why[200];
	if (tap_route_json_fields(json_object_get(c, "headers"), true, 8, &hold, &hf, &nh, why, sizeof why)) {
		free(exp);
		snprintf(err, err_cap, "\"headers\": %s", why);
		return 2;
	}
	const char *vh = vj ? json_string_value(vj) : o->vhost;
	struct tap_route_msg msg = {.vhost = vh,
	                            .vhost_len = vj ? json_string_length(vj) : strlen(vh),
	                            .exchange = json_string_value(xj),
	                            .exchange_len = json_string_length(xj),
	                            .key = kj ? json_string_value(kj) : "",
	                            .key_len = kj ? json_string_length(kj) : 0,
	                            .headers = hf,
	                            .n_headers = nh};
	struct tap_route_result r;
	int rc = tap_route(m, &msg, &r);
	tap_route_json_free(hold);
	if (rc) {
		free(exp);
		snprintf(err, err_cap, "out of memory");
		return 2;
	}
	struct name *got = sorted_names(m, &r);
	const char *want_outcome = oj ? json_string_value(oj) : "ok";
	bool same =
	    !strcmp(want_outcome, tap_route_outcome_name(r.outcome)) && (!aj || json_is_true(aj) == r.alternate);
	if (same && qj) {
		same = n_exp == r.n_queues;
		for (size_t i = 0; same && i < n_exp; i++)
			same = !cmp_name(&exp[i], &got[i]);
	}
	if (!same) {
		printf("%s: exchange '%.*s' key '%.*s': expected ", where, (int)msg.exchange_len, msg.exchange,
		       (int)msg.key_len, msg.key);
		if (oj && strcmp(want_outcome, "ok"))
			printf("%s", want_outcome);
		else
			put_names(stdout, exp, n_exp);
		if (aj)
			printf(json_is_true(aj) ? " by an alternate" : " not by an alternate");
		printf(", got ");
		if (r.outcome != TAP_ROUTE_OK)
			printf("%s", tap_route_outcome_name(r.outcome));
		else
			put_names(stdout, got, r.n_queues);
		if (r.alternate)
			printf(" by an alternate");
		putchar('\n');
	}
	free(got);
	free(exp);
	return same ? 0 : 1;
}

static int run_tests(struct tap_route_model *m, const struct route_opts *o)
{
	char *data, err[400];
	size_t len;
	if (tap_files_read(o->test, ROUTE_MAX_CASES_BYTES, &data, &len, err, sizeof err))
		return usage_err("--test: %s", err);
	unsigned long cases = 0, failed = 0;
	int status = 0;
	size_t line_no = 0;
	for (char *p = data, *end = data + len; p < end && status != 2;) {
		char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
		char *line = p;
		p += l + 1;
		line_no++;
		while (l && (line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t'))
			l--;
		size_t s = 0;
		while (s < l && (line[s] == ' ' || line[s] == '\t'))
			s++;
		if (s == l || line[s] == '#')
			continue;
		char where[300];
		snprintf(where, sizeof where, "%s:%zu", o->test, line_no);
		json_error_t je;
		json_t *c = json_loadb(line + s, l - s, JSON_REJECT_DUPLICATES, &je);
		if (!c) {
			fprintf(stderr, "amqptap: route: --test %s: %s\n", where, je.text);
			status = 2;
			break;
		}
		int rc = run_case(m, o, c, where, err, sizeof err);
		json_decref(c);
		if (rc == 2) {
			fprintf(stderr, "amqptap: route: --test %s: %s\n", where, err);
			status = 2;
			break;
		}
		cases++;
		failed += rc;
	}
	free(data);
	if (status == 2)
		return 2;
	if (o->json)
		printf("{\"cases\":%lu,\"failed\":%lu}\n", cases, failed);
	else
		printf("%lu case%s, %lu failed\n", cases, cases == 1 ? "" : "s", failed);
	return failed ? 1 : 0;
}

/* The definitions' JSON, from the file or the management API (*data malloc'd). 0, or the exit code after its line. */
static int read_definitions(const struct route_opts *o, size_t max, char **data, size_t *len)
{
	char err[400];
	if (o->definitions) {
		if (tap_files_read(o->definitions, max, data, len, err, sizeof err))
			return usage_err("--definitions: %s", err);
		return 0;
	}
	char *cred = NULL;
	if (o->credentials && tap_mgmt_credentials_read(o->credentials, &cred, err, sizeof err))
		return usage_err("--management-credentials %s", err);
	enum tap_mgmt_fetch got = tap_mgmt_fetch_once(o->management, cred, o->ca, max, data, len, err, sizeof err);
	tap_mgmt_credentials_free(cred);
	switch (got) {
	case TAP_MGMT_FETCHED:
		return 0;
	case TAP_MGMT_BAD_SETUP:
		return usage_err("--management %s", err);
	case TAP_MGMT_NOT_ANSWERED:
		break;
	}
	fprintf(stderr, "amqptap: route: --management %s: %s\n", o->management, err);
	return ROUTE_EXIT_UNREACHABLE;
}

int app_run_route(int argc, char **argv)
{
	struct route_opts o;
	int rc = parse_opts(argc, argv, &o);
	if (rc >= 0)
		return rc;
	struct tap_route_defs_limits lim;
	tap_route_defs_limits_default(&lim);
	char *data, err[400];
	size_t len;
	if ((rc = read_definitions(&o, lim.max_input, &data, &len)))
		return rc;
	struct tap_route_model *m = NULL;
	rc = tap_route_defs_load(data, len, o.vhost, &lim, &m, err, sizeof err);
	free(data);
	if (rc) {
		fprintf(stderr, "amqptap: route: %s %s: %s\n", o.definitions ? "--definitions" : "--management",
			o.definitions ? o.definitions : o.management, err);
		return 2;
	}
	rc = o.test ? run_tests(m, &o) : run_query(m, &o);
	tap_route_model_free(m);
	return rc;
}
