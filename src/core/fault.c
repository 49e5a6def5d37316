/* The fault rules (include/amqptap/fault.h): their parser and the set in force. A rule is ACTION, optionally
 * followed by ':' and KEY=VALUE items separated by commas; the first item may be the action's parameter alone
 * ("delay-confirms:500" is "delay-confirms:ms=500"). Every key is checked: an unknown one, one given twice, a
 * parameter of another action or a bad value makes the whole rule an error, named in one line. */
#include "amqptap/fault.h"

#include "amqptap/status.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
	const char *name;
	bool publishes; /* selected by publish (every, after, p, exchange, routing key apply) */
} actions[TAP_FAULT_ACTIONS] = {
	[TAP_FAULT_NACK] = {"nack", true},
	[TAP_FAULT_WITHHOLD] = {"withhold-confirms", true},
	[TAP_FAULT_DELAY] = {"delay-confirms", true},
	[TAP_FAULT_KILL] = {"kill", true},
	[TAP_FAULT_CLOSE_CHANNEL] = {"close-channel", true},
	[TAP_FAULT_BLOCK] = {"block", true},
	[TAP_FAULT_RETURN] = {"return", true},
	[TAP_FAULT_RETURN_AFTER_ACK] = {"return-after-ack", true},
	[TAP_FAULT_STALL_HEARTBEATS] = {"stall-heartbeats", false},
	[TAP_FAULT_LATENCY] = {"latency", false},
	[TAP_FAULT_BANDWIDTH] = {"bandwidth", false},
};

const char *tap_fault_action_name(enum tap_fault_action a)
{
	return (unsigned)a < TAP_FAULT_ACTIONS ? actions[a].name : "unknown";
}

const char *tap_fault_way_name(enum tap_fault_way w)
{
	static const char *const names[] = {"both", "up", "down"};
	return (unsigned)w < sizeof names / sizeof names[0] ? names[w] : "unknown";
}

const char *tap_fault_saw_name(enum tap_fault_saw s)
{
	static const char *const names[] = {"ack", "nack", "none", "return", "ack_then_return", "channel_closed"};
	return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

/* The channel exceptions (AMQP 0-9-1's soft errors) a close-channel rule may show the client. */
static const struct {
	uint16_t code;
	const char *name;
} close_codes[] = {
    {311, "CONTENT_TOO_LARGE"}, {312, "NO_ROUTE"},        {313, "NO_CONSUMERS"},        {403, "ACCESS_REFUSED"},
    {404, "NOT_FOUND"},         {405, "RESOURCE_LOCKED"}, {406, "PRECONDITION_FAILED"},
};

const char *tap_fault_close_code_name(uint16_t code)
{
	for (size_t i = 0; i < sizeof close_codes / sizeof close_codes[0]; i++)
		if (close_codes[i].code == code)
			return close_codes[i].name;
	return NULL;
}

static int rule_error(char *err, size_t cap, const char *spec, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int rule_error(char *err, size_t cap, const char *spec, const char *fmt, ...)
{
	char why[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof why, fmt, ap);
	va_end(ap);
	char shown[201]; /* the rule as given, but one line whatever it holds */
	size_t n = 0;
	for (; spec[n] && n < sizeof shown - 1; n++)
		shown[n] = spec[n] >= ' ' && spec[n] <= '~' ? spec[n] : '?';
	shown[n] = '\0';
	snprintf(err, cap, "--fault '%s': %s", shown, why);
	for (char *q = err; cap && *q; q++) /* the reason quotes parts of the rule too */
		if (*q < ' ' || *q > '~')
			*q = '?';
	return TAP_E_USAGE;
}

static bool parse_u64(const char *v, uint64_t min, uint64_t max, uint64_t *out)
{
	if (*v < '0' || *v > '9')
		return false;
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (errno || *end || n < min || n > max)
		return false;
	*out = n;
	return true;
}

/* A probability: 0 < p <= 1, as a decimal fraction ("0.05", "1"). */
static bool parse_p(const char *v, double *out)
{
	if ((*v < '0' || *v > '9') && *v != '.')
		return false;
	char *end;
	errno = 0;
	double d = strtod(v, &end);
	if (errno || *end || !(d > 0.0) || d > 1.0)
		return false;
	*out = d;
	return true;
}

/* Printable ASCII (a selector compared byte for byte with what the client sent). */
static bool printable(const char *v)
{
	for (; *v; v++)
		if (*v < ' ' || *v > '~')
			return false;
	return true;
}

enum key {
	K_CONN, K_CLIENT, K_USER, K_VHOST, K_NAME, K_CHANNEL, K_EXCHANGE, K_ROUTING_KEY, K_EVERY, K_AFTER, K_TIMES,
	K_P, K_SEED, K_FOR, K_MS, K_MODE, K_SECONDS, K_JITTER, K_KIB, K_DIR, K_CODE, K_TEXT, K_COUNT
};

static const struct {
	const char *name;
	bool publish_only; /* a publish selector */
} keys[K_COUNT] = {
	[K_CONN] = {"conn", false},        [K_CLIENT] = {"client", false},   [K_USER] = {"user", false},
	[K_VHOST] = {"vhost", false},      [K_NAME] = {"name", false},       [K_CHANNEL] = {"channel", true},
	[K_EXCHANGE] = {"exchange", true}, [K_ROUTING_KEY] = {"routing_key", true},
	[K_EVERY] = {"every", true},       [K_AFTER] = {"after", true},      [K_TIMES] = {"times", true},
	[K_P] = {"p", true},               [K_SEED] = {"seed", true},        [K_FOR] = {"for", false},
	[K_MS] = {"ms", false},            [K_MODE] = {"mode", false},       [K_SECONDS] = {"seconds", false},
	[K_JITTER] = {"jitter", false},    [K_KIB] = {"kib", false},         [K_DIR] = {"dir", false},
	[K_CODE] = {"code", false},        [K_TEXT] = {"text", false},
};

static int find_key(const char *k, size_t len)
{
	if (len == 2 && memcmp(k, "rk", 2) == 0)
		return K_ROUTING_KEY;
	for (int i = 0; i < K_COUNT; i++)
		if (strlen(keys[i].name) == len && memcmp(keys[i].name, k, len) == 0)
			return i;
	return -1;
}

/* The key a bare first item stands for, or -1 when the action takes no parameter. */
static int bare_key(enum tap_fault_action a)
{
	switch (a) {
	case TAP_FAULT_DELAY:
	case TAP_FAULT_LATENCY:
		return K_MS;
	case TAP_FAULT_KILL:
		return K_MODE;
	case TAP_FAULT_BLOCK:
		return K_SECONDS;
	case TAP_FAULT_BANDWIDTH:
		return K_KIB;
	case TAP_FAULT_CLOSE_CHANNEL:
		return K_CODE;
	default:
		return -1;
	}
}

static bool copy_str(char *dst, size_t cap, const char *v)
{
	size_t n = strlen(v);
	if (n >= cap || !printable(v))
		return false;
	memcpy(dst, v, n + 1);
	return true;
}

static int apply_key(struct tap_fault_rule *r, int k, const char *v, const char *spec, char *err, size_t cap)
{
	uint64_t n;
	switch (k) {
	case K_CONN:
		if (!parse_u64(v, 1, UINT64_MAX, &r->conn))
			return rule_error(err, cap, spec, "conn: expected a connection id >= 1, got '%s'", v);
		return TAP_OK;
	case K_CLIENT:
		if (!*v || !copy_str(r->client, sizeof r->client, v) || strchr(v, ' '))
			return rule_error(err, cap, spec, "client: expected IP or IP:PORT, got '%s'", v);
		return TAP_OK;
	case K_USER:
	case K_VHOST:
	case K_NAME: {
		char *dst = k == K_USER ? r->user : k == K_VHOST ? r->vhost : r->name;
		if (!*v || !copy_str(dst, sizeof r->user, v))
			return rule_error(err, cap, spec, "%s: expected 1 to 127 printable characters, got '%s'",
					  keys[k].name, v);
		return TAP_OK;
	}
	case K_CHANNEL:
		if (!parse_u64(v, 1, 65535, &n))
			return rule_error(err, cap, spec, "channel: expected a channel number from 1 to 65535, got '%s'", v);
		r->has_channel = true;
		r->channel = (uint16_t)n;
		return TAP_OK;
	case K_EXCHANGE: /* "" is the default exchange: exchange= selects it */
		if (!copy_str(r->exchange, sizeof r->exchange, v))
			return rule_error(err, cap, spec, "exchange: expected at most 255 printable characters");
		r->has_exchange = true;
		return TAP_OK;
	case K_ROUTING_KEY:
		if (!copy_str(r->routing_key, sizeof r->routing_key, v))
			return rule_error(err, cap, spec, "routing_key: expected at most 255 printable characters");
		r->has_routing_key = true;
		return TAP_OK;
	case K_EVERY:
	case K_AFTER:
	case K_TIMES: {
		uint64_t *dst = k == K_EVERY ? &r->every : k == K_AFTER ? &r->after : &r->times;
		if (!parse_u64(v, k == K_AFTER ? 0 : 1, UINT64_C(1) << 62, dst))
			return rule_error(err, cap, spec, "%s: expected a whole number >= %d, got '%s'", keys[k].name,
					  k == K_AFTER ? 0 : 1, v);
		return TAP_OK;
	}
	case K_P:
		if (!parse_p(v, &r->p))
			return rule_error(err, cap, spec, "p: expected a probability above 0 and at most 1, got '%s'", v);
		return TAP_OK;
	case K_SEED:
		if (!parse_u64(v, 0, UINT64_MAX, &r->seed))
			return rule_error(err, cap, spec, "seed: expected a whole number, got '%s'", v);
		return TAP_OK;
	case K_FOR:
		if (!parse_u64(v, 1, 7u * 24 * 3600, &n))
			return rule_error(err, cap, spec, "for: expected seconds from 1 to 604800, got '%s'", v);
		r->for_ms = (uint32_t)(n * 1000);
		return TAP_OK;
	case K_MS:
		if (r->action != TAP_FAULT_DELAY && r->action != TAP_FAULT_LATENCY)
			break;
		if (!parse_u64(v, 1, 3600u * 1000u, &n))
			return rule_error(err, cap, spec, "ms: expected milliseconds from 1 to 3600000, got '%s'", v);
		r->ms = (uint32_t)n;
		return TAP_OK;
	case K_SECONDS:
		if (r->action != TAP_FAULT_BLOCK)
			break;
		if (!parse_u64(v, 1, 3600, &n))
			return rule_error(err, cap, spec, "seconds: expected seconds from 1 to 3600, got '%s'", v);
		r->seconds = (uint32_t)n;
		return TAP_OK;
	case K_JITTER:
		if (r->action != TAP_FAULT_LATENCY)
			break;
		if (!parse_u64(v, 0, 3600u * 1000u, &n))
			return rule_error(err, cap, spec, "jitter: expected milliseconds from 0 to 3600000, got '%s'", v);
		r->jitter_ms = (uint32_t)n;
		return TAP_OK;
	case K_KIB:
		if (r->action != TAP_FAULT_BANDWIDTH)
			break;
		if (!parse_u64(v, 1, TAP_FAULT_KIB_MAX, &n))
			return rule_error(err, cap, spec, "kib: expected KiB a second from 1 to %u, got '%s'",
					  TAP_FAULT_KIB_MAX, v);
		r->kib = (uint32_t)n;
		return TAP_OK;
	case K_DIR:
		if (r->action != TAP_FAULT_LATENCY && r->action != TAP_FAULT_BANDWIDTH)
			break;
		if (strcmp(v, "both") == 0)
			r->way = TAP_FAULT_BOTH;
		else if (strcmp(v, "up") == 0)
			r->way = TAP_FAULT_UP;
		else if (strcmp(v, "down") == 0)
			r->way = TAP_FAULT_DOWN;
		else
			return rule_error(err, cap, spec, "dir: expected up, down or both, got '%s'", v);
		return TAP_OK;
	case K_CODE:
		if (r->action != TAP_FAULT_CLOSE_CHANNEL)
			break;
		if (!parse_u64(v, 0, 999, &n) || !tap_fault_close_code_name((uint16_t)n))
			return rule_error(err, cap, spec,
					  "code: expected a channel exception (311, 312, 313, 403, 404, 405, 406), got '%s'", v);
		r->close_code = (uint16_t)n;
		return TAP_OK;
	case K_TEXT: /* no comma: it would end the item */
		if (r->action != TAP_FAULT_CLOSE_CHANNEL)
			break;
		if (!*v || !copy_str(r->close_text, sizeof r->close_text, v))
			return rule_error(err, cap, spec, "text: expected 1 to %d printable characters",
					  TAP_FAULT_CLOSE_TEXT_MAX);
		return TAP_OK;
	case K_MODE:
		if (r->action != TAP_FAULT_KILL)
			break;
		if (strcmp(v, "reset") == 0)
			r->kill_mode = TAP_FAULT_KILL_RESET;
		else if (strcmp(v, "close") == 0)
			r->kill_mode = TAP_FAULT_KILL_CLOSE;
		else
			return rule_error(err, cap, spec, "mode: expected reset or close, got '%s'", v);
		return TAP_OK;
	}
	return rule_error(err, cap, spec, "%s: not a parameter of %s", keys[k].name, actions[r->action].name);
}

int tap_fault_parse(const char *spec, struct tap_fault_rule *out, char *err, size_t cap)
{
	memset(out, 0, sizeof *out);
	size_t len = strlen(spec);
	if (len == 0)
		return rule_error(err, cap, spec, "empty rule (expected ACTION[:KEY=VALUE,...])");
	if (len >= sizeof out->text)
		return rule_error(err, cap, spec, "longer than %zu bytes", sizeof out->text - 1);
	memcpy(out->text, spec, len + 1);
	char buf[sizeof out->text];
	memcpy(buf, spec, len + 1);
	char *colon = strchr(buf, ':');
	if (colon)
		*colon = '\0';
	int a = -1;
	for (int i = 0; i < TAP_FAULT_ACTIONS; i++)
		if (strcmp(buf, actions[i].name) == 0)
			a = i;
	if (a < 0)
		return rule_error(err, cap, spec,
				  "unknown action '%.40s' (nack, withhold-confirms, delay-confirms, kill, close-channel, block, "
				  "return, return-after-ack, stall-heartbeats, latency, bandwidth)",
				  buf);
	out->action = (enum tap_fault_action)a;
	out->seed = 1;
	out->close_code = 406;
	bool given[K_COUNT] = {false};
	if (colon) {
		char *item = colon + 1;
		if (!*item)
			return rule_error(err, cap, spec, "nothing after ':'");
		for (int first = 1;; first = 0) {
			char *comma = strchr(item, ',');
			if (comma)
				*comma = '\0';
			char *eq = strchr(item, '=');
			int k;
			const char *v;
			if (!eq) {
				k = first ? bare_key(out->action) : -1;
				if (k < 0)
					return rule_error(err, cap, spec, "'%.40s': expected KEY=VALUE", item);
				v = item;
			} else {
				k = find_key(item, (size_t)(eq - item));
				if (k < 0)
					return rule_error(err, cap, spec, "unknown key '%.*s'", (int)(eq - item > 40 ? 40 : eq - item),
							  item);
				v = eq + 1;
			}
			if (given[k])
				return rule_error(err, cap, spec, "%s given twice", keys[k].name);
			given[k] = true;
			if (keys[k].publish_only && !actions[a].publishes)
				return rule_error(err, cap, spec, "%s: %s is not selected by publish", keys[k].name,
						  actions[a].name);
			int rc = apply_key(out, k, v, spec, err, cap);
			if (rc)
				return rc;
			if (!comma)
				break;
			item = comma + 1;
		}
	}
	if (out->action == TAP_FAULT_DELAY && !given[K_MS])
		return rule_error(err, cap, spec, "delay-confirms needs ms=MS");
	if (out->action == TAP_FAULT_LATENCY && !given[K_MS])
		return rule_error(err, cap, spec, "latency needs ms=MS");
	if (out->action == TAP_FAULT_BANDWIDTH && !given[K_KIB])
		return rule_error(err, cap, spec, "bandwidth needs kib=KIB");
	if (out->action == TAP_FAULT_BLOCK && !given[K_SECONDS])
		return rule_error(err, cap, spec, "block needs seconds=SECONDS");
	if (given[K_SEED] && !given[K_P])
		return rule_error(err, cap, spec, "seed: only with p=");
	return TAP_OK;
}

void tap_fault_set_init(struct tap_fault_set *s)
{
	memset(s, 0, sizeof *s);
	s->next_id = 1;
}

int tap_fault_set_add(struct tap_fault_set *s, const struct tap_fault_rule *r, int64_t now_us, uint32_t *id)
{
	if (s->n == TAP_FAULT_RULES_MAX)
		return TAP_E_FULL;
	s->rules[s->n] = *r;
	s->rules[s->n].id = s->next_id++;
	s->added_us[s->n] = now_us;
	s->rng[s->n] = r->seed ? r->seed : 0x9E3779B97F4A7C15u; /* xorshift64 never leaves 0 */
	s->rule_acted[s->n] = 0;
	if (id)
		*id = s->rules[s->n].id;
	s->n++;
	return TAP_OK;
}

bool tap_fault_set_remove(struct tap_fault_set *s, uint32_t id)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->rules[i].id != id)
			continue;
		memmove(&s->rules[i], &s->rules[i + 1], (s->n - i - 1) * sizeof s->rules[0]);
		memmove(&s->added_us[i], &s->added_us[i + 1], (s->n - i - 1) * sizeof s->added_us[0]);
		memmove(&s->rng[i], &s->rng[i + 1], (s->n - i - 1) * sizeof s->rng[0]);
		memmove(&s->rule_acted[i], &s->rule_acted[i + 1], (s->n - i - 1) * sizeof s->rule_acted[0]);
		s->n--;
		return true;
	}
	return false;
}
