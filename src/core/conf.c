/* The option table of DESIGN §1 and the parser that applies it to a
 * struct tap_conf. Each option is one row: name, argument kind, field. */
#include "amqptap/conf.h"

#include "amqptap/status.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum opt_kind {
	OPT_ADDR_LISTEN,   /* HOST:PORT, port 0 allowed */
	OPT_ADDR,          /* HOST:PORT */
	OPT_PATH,          /* a file name */
	OPT_U32,           /* a non-negative integer */
	OPT_FLAG,          /* a bool set to true */
	OPT_HELP,
	OPT_VERSION,
};

struct opt_def {
	const char *name;  /* long name without dashes */
	char short_name;
	enum opt_kind kind;
	size_t offset;
	uint32_t min, max; /* OPT_U32 bounds */
	const char *arg;   /* placeholder in --help */
	const char *help;
};

#define FIELD(f) offsetof(struct tap_conf, f)

static const struct opt_def options[] = {
	{"listen", 'l', OPT_ADDR_LISTEN, FIELD(listen), 0, 0, "ADDR:PORT",
	 "where clients connect (default 127.0.0.1:5673)"},
	{"upstream", 'u', OPT_ADDR, FIELD(upstream), 0, 0, "HOST:PORT", "the real broker (default 127.0.0.1:5672)"},
	{"verdicts", 'o', OPT_PATH, FIELD(verdicts), 0, 0, "FILE|-", "verdict and event records, JSON Lines (default -)"},
	{"frames", 'f', OPT_PATH, FIELD(frames), 0, 0, "FILE", "one JSON line per decoded frame (default off)"},
	{"pcap", 0, OPT_PATH, FIELD(pcap), 0, 0, "FILE", "the plaintext AMQP streams as pcapng for Wireshark (default off)"},
	{"port", 0, OPT_U32, FIELD(replay_port), 1, 65535, "N", "replay: the broker's TCP port in the capture (default 5672)"},
	{"body-bytes", 0, OPT_U32, FIELD(body_bytes), 0, 1u << 20, "N",
	 "include the first N body bytes in --frames (default 0)"},
	{"return-window", 0, OPT_U32, FIELD(return_window_ms), 1, 3600u * 1000u, "MS",
	 "non-confirm channels: how long a mandatory publish waits for a Return (default 2000)"},
	{"late-return", 0, OPT_U32, FIELD(late_return_ms), 1, 60u * 1000u, "MS",
	 "confirm channels: how long an acked mandatory publish waits for a late Return (default 50)"},
	{"max-outstanding", 0, OPT_U32, FIELD(max_outstanding), 1, UINT32_MAX, "N",
	 "tracked publishes per connection before the oldest is evicted (default 1000000)"},
	{"grace", 0, OPT_U32, FIELD(grace_ms), 0, 3600u * 1000u, "MS",
	 "on SIGINT/SIGTERM, how long live sessions may finish before they are closed (default 1000)"},
	{"handshake-timeout", 0, OPT_U32, FIELD(handshake_timeout_ms), 0, 3600u * 1000u, "MS",
	 "longest a client's TLS handshake or the connection to the broker (connect, TLS) may take; 0: no limit "
	 "(default 10000)"},
	{"tls-cert", 0, OPT_PATH, FIELD(tls_cert), 0, 0, "FILE", "accept TLS from clients with this certificate (PEM chain)"},
	{"tls-key", 0, OPT_PATH, FIELD(tls_key), 0, 0, "FILE", "private key of --tls-cert (PEM)"},
	{"tls-client-ca", 0, OPT_PATH, FIELD(tls_client_ca), 0, 0, "FILE",
	 "require client certificates signed by this CA (PEM)"},
	{"upstream-tls", 0, OPT_FLAG, FIELD(upstream_tls), 0, 0, NULL, "speak TLS to the broker (verification on)"},
	{"upstream-ca", 0, OPT_PATH, FIELD(upstream_ca), 0, 0, "FILE", "CA bundle for the broker (default: system store)"},
	{"upstream-sni", 0, OPT_PATH, FIELD(upstream_sni), 0, 0, "NAME",
	 "server name sent and checked (default: the --upstream host)"},
	{"upstream-cert", 0, OPT_PATH, FIELD(upstream_cert), 0, 0, "FILE", "client certificate for the broker (mTLS)"},
	{"upstream-key", 0, OPT_PATH, FIELD(upstream_key), 0, 0, "FILE", "private key of --upstream-cert"},
	{"upstream-insecure", 0, OPT_FLAG, FIELD(upstream_insecure), 0, 0, NULL,
	 "do not verify the broker's certificate (logged loudly)"},
	{"keylog", 0, OPT_PATH, FIELD(keylog), 0, 0, "FILE",
	 "NSS key log of both TLS legs, mode 0600 (default: $SSLKEYLOGFILE)"},
	{"help", 'h', OPT_HELP, 0, 0, 0, NULL, "show this help and exit"},
	{"version", 'V', OPT_VERSION, 0, 0, 0, NULL, "show the version and exit"},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

void tap_conf_defaults(struct tap_conf *c)
{
	memset(c, 0, sizeof *c);
	c->mode = TAP_MODE_PROXY;
	snprintf(c->listen.host, sizeof c->listen.host, "127.0.0.1");
	c->listen.port = 5673;
	snprintf(c->upstream.host, sizeof c->upstream.host, "127.0.0.1");
	c->upstream.port = 5672;
	c->verdicts = "-";
	c->return_window_ms = 2000;
	c->late_return_ms = 50;
	c->max_outstanding = 1000000;
	c->grace_ms = 1000;
	c->handshake_timeout_ms = 10000;
	c->replay_port = 5672;
}

int tap_conf_parse_addr(const char *s, bool allow_port0, struct tap_conf_addr *out)
{
	const char *host = s, *host_end, *colon;
	if (*s == '[') {
		host = s + 1;
		host_end = strchr(host, ']');
		if (!host_end || host_end[1] != ':')
			return TAP_E_BAD_ADDRESS;
		colon = host_end + 1;
	} else {
		colon = strrchr(s, ':');
		if (!colon)
			return TAP_E_BAD_ADDRESS;
		host_end = colon;
		if (memchr(s, ':', (size_t)(colon - s)))
			return TAP_E_BAD_ADDRESS; /* bare IPv6 needs brackets */
	}
	size_t hlen = (size_t)(host_end - host);
	if (hlen == 0 || hlen >= sizeof out->host)
		return TAP_E_BAD_ADDRESS;
	const char *port = colon + 1;
	if (*port < '0' || *port > '9')
		return TAP_E_BAD_ADDRESS;
	char *end;
	errno = 0;
	unsigned long p = strtoul(port, &end, 10);
	if (errno || *end || p > 65535 || (p == 0 && !allow_port0))
		return TAP_E_BAD_ADDRESS;
	for (size_t i = 0; i < hlen; i++)
		if (host[i] == ' ' || host[i] == '/' || host[i] == '[' || host[i] == ']')
			return TAP_E_BAD_ADDRESS;
	memcpy(out->host, host, hlen);
	out->host[hlen] = '\0';
	out->port = (uint16_t)p;
	return TAP_OK;
}

void tap_conf_addr_format(const struct tap_conf_addr *a, char *out, size_t cap)
{
	if (strchr(a->host, ':'))
		snprintf(out, cap, "[%s]:%u", a->host, a->port);
	else
		snprintf(out, cap, "%s:%u", a->host, a->port);
}

static int usage_error(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int usage_error(char *err, size_t cap, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, cap, fmt, ap);
	va_end(ap);
	return TAP_E_USAGE;
}

static const struct opt_def *find_long(const char *name, size_t len)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (strlen(options[i].name) == len && memcmp(options[i].name, name, len) == 0)
			return &options[i];
	return NULL;
}

static const struct opt_def *find_short(char c)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].short_name && options[i].short_name == c)
			return &options[i];
	return NULL;
}

static bool opt_takes_value(const struct opt_def *o)
{
	return o->kind != OPT_HELP && o->kind != OPT_VERSION && o->kind != OPT_FLAG;
}

static int apply(struct tap_conf *c, const struct opt_def *o, const char *value, char *err, size_t cap)
{
	char *field = (char *)c + o->offset;
	switch (o->kind) {
	case OPT_ADDR_LISTEN:
	case OPT_ADDR:
		if (tap_conf_parse_addr(value, o->kind == OPT_ADDR_LISTEN, (struct tap_conf_addr *)(void *)field))
			return usage_error(err, cap, "--%s: expected HOST:PORT with a port %s-65535 (IPv6 as [ADDR]:PORT), got '%s'",
					   o->name, o->kind == OPT_ADDR_LISTEN ? "0" : "1", value);
		return TAP_OK;
	case OPT_PATH:
		if (!*value)
			return usage_error(err, cap, "--%s: empty file name", o->name);
		*(const char **)(void *)field = value;
		return TAP_OK;
	case OPT_U32: {
		char *end;
		errno = 0;
		unsigned long long v = (*value >= '0' && *value <= '9') ? strtoull(value, &end, 10) : ULLONG_MAX;
		if (*value < '0' || *value > '9' || errno || *end || v > o->max || v < o->min)
			return usage_error(err, cap, "--%s: expected a whole number from %u to %u, got '%s'", o->name,
					   o->min, o->max, value);
		*(uint32_t *)(void *)field = (uint32_t)v;
		return TAP_OK;
	}
	case OPT_FLAG:
		*(bool *)(void *)field = true;
		return TAP_OK;
	case OPT_HELP:
		c->mode = TAP_MODE_HELP;
		return TAP_OK;
	case OPT_VERSION:
		c->mode = TAP_MODE_VERSION;
		return TAP_OK;
	}
	return TAP_E_USAGE;
}

/* Options that only make sense together. */
static int check_combinations(const struct tap_conf *c, char *err, size_t cap)
{
	if (!c->tls_cert != !c->tls_key)
		return usage_error(err, cap, "%s: --tls-cert and --tls-key go together", c->tls_cert ? "--tls-cert" : "--tls-key");
	if (c->tls_client_ca && !c->tls_cert)
		return usage_error(err, cap, "--tls-client-ca: needs --tls-cert and --tls-key");
	if (!c->upstream_cert != !c->upstream_key)
		return usage_error(err, cap, "%s: --upstream-cert and --upstream-key go together",
				   c->upstream_cert ? "--upstream-cert" : "--upstream-key");
	const char *needs_tls = c->upstream_ca ? "--upstream-ca"
				: c->upstream_sni ? "--upstream-sni"
				: c->upstream_cert ? "--upstream-cert"
				: c->upstream_insecure ? "--upstream-insecure"
				: NULL;
	if (needs_tls && !c->upstream_tls)
		return usage_error(err, cap, "%s: needs --upstream-tls", needs_tls);
	return TAP_OK;
}

int tap_conf_parse(struct tap_conf *c, int argc, char **argv, char *err, size_t cap)
{
	bool replay = argc > 1 && strcmp(argv[1], "replay") == 0;
	bool port_given = false;
	for (int i = replay ? 2 : 1; i < argc; i++) {
		const char *a = argv[i];
		const struct opt_def *o;
		const char *value = NULL;
		char shown[64];
		if (a[0] == '-' && a[1] == '-' && a[2]) {
			const char *eq = strchr(a + 2, '=');
			size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
			o = find_long(a + 2, len);
			if (!o)
				return usage_error(err, cap, "%.*s: unknown option (see --help)", (int)(len + 2), a);
			if (eq)
				value = eq + 1;
			snprintf(shown, sizeof shown, "--%s", o->name);
		} else if (a[0] == '-' && a[1] && !a[2]) {
			o = find_short(a[1]);
			if (!o)
				return usage_error(err, cap, "%s: unknown option (see --help)", a);
			snprintf(shown, sizeof shown, "--%s", o->name);
		} else if (replay && !c->replay_file) {
			c->replay_file = a;
			continue;
		} else {
			return usage_error(err, cap, "'%s': unexpected argument (see --help)", a);
		}
		if (o->offset == FIELD(replay_port) && o->kind == OPT_U32)
			port_given = true;
		if (opt_takes_value(o)) {
			if (!value) {
				if (i + 1 >= argc)
					return usage_error(err, cap, "%s: missing value %s", shown, o->arg);
				value = argv[++i];
			}
		} else if (value) {
			return usage_error(err, cap, "%s: takes no value", shown);
		}
		int rc = apply(c, o, value, err, cap);
		if (rc)
			return rc;
		if (c->mode == TAP_MODE_HELP || c->mode == TAP_MODE_VERSION)
			return TAP_OK;
	}
	if (port_given && !replay)
		return usage_error(err, cap, "--port: only for 'amqptap replay'");
	if (replay) {
		c->mode = TAP_MODE_REPLAY;
		if (!c->replay_file)
			return usage_error(err, cap, "replay: missing the CAPTURE file (amqptap replay CAPTURE [--port N])");
	}
	return check_combinations(c, err, cap);
}

void tap_conf_usage(char *out, size_t cap)
{
	size_t off = 0;
	int n = snprintf(out, cap,
			 "usage: amqptap [options]                     transparent AMQP 0-9-1 wire-tap proxy\n"
			 "       amqptap replay CAPTURE [options]      the same records from a pcap/pcapng capture\n"
			 "       amqptap --help | --version\n\noptions:\n");
	for (size_t i = 0; n >= 0 && i < N_OPTIONS; i++) {
		off += (size_t)n;
		if (off >= cap)
			return;
		const struct opt_def *o = &options[i];
		char left[64];
		char shortpart[8] = "";
		if (o->short_name)
			snprintf(shortpart, sizeof shortpart, "-%c, ", o->short_name);
		snprintf(left, sizeof left, "%s--%s%s%s", shortpart, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
		n = snprintf(out + off, cap - off, "  %-28s %s\n", left, o->help);
	}
}
