/* The option table of src/DESIGN.md §1 and the getopt_long parser that applies it to a struct tap_conf. Each option
 * is one row: name, short name, argument kind, field, bounds, default, help. The renderings of the same table
 * (--help, man page, bash completion) are in conf_doc.c. */
#include "amqptap/conf.h"

#include "amqptap/fault.h"
#include "amqptap/status.h"
#include "amqptap/track.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define FIELD(f) offsetof(struct tap_conf, f)

_Static_assert(TAP_CONF_FAULTS_MAX == TAP_FAULT_RULES_MAX, "every --fault rule can be in force");

static const struct tap_conf_option options[] = {
	{.name = "listen", .short_name = 'l', .kind = TAP_OPT_ADDR_LISTEN, .offset = FIELD(listen), .arg = "ADDR:PORT",
	 .def = "127.0.0.1:5673", .help = "where clients connect", .modes = TAP_FOR_PROXY},
	{.name = "upstream", .short_name = 'u', .kind = TAP_OPT_ADDR, .offset = FIELD(upstream), .arg = "HOST:PORT",
	 .def = "127.0.0.1:5672", .help = "the real broker", .modes = TAP_FOR_PROXY},
	{.name = "verdicts", .short_name = 'o', .kind = TAP_OPT_PATH, .offset = FIELD(verdicts), .arg = "FILE|-",
	 .def = "-", .help = "verdict and event records, JSON Lines (- is stdout)"},
	{.name = "frames", .short_name = 'f', .kind = TAP_OPT_PATH, .offset = FIELD(frames), .arg = "FILE",
	 .def_shown = "off", .help = "one JSON line per decoded frame"},
	{.name = "pcap", .kind = TAP_OPT_PATH, .offset = FIELD(pcap), .arg = "FILE", .def_shown = "off",
	 .help = "the plaintext AMQP streams as pcapng for Wireshark"},
	{.name = "port", .kind = TAP_OPT_PORTS, .offset = FIELD(ports), .min = 1, .max = 65535, .arg = "N",
	 .def_u32 = 5672, .help = "replay, sniff: the broker's TCP port in the capture (repeatable, at most 16)",
	 .modes = TAP_FOR_REPLAY | TAP_FOR_SNIFF},
	{.name = "interface", .short_name = 'i', .kind = TAP_OPT_IFACE, .offset = FIELD(interface), .arg = "IF",
	 .def_shown = "none", .help = "sniff: the interface to capture on (lo, eth0, any)", .modes = TAP_FOR_SNIFF},
	{.name = "buffer-size", .kind = TAP_OPT_U32, .offset = FIELD(buffer_kib), .min = 256, .max = 4u << 20,
	 .arg = "KIB", .def_u32 = 16384, .help = "sniff: the kernel capture buffer in KiB", .modes = TAP_FOR_SNIFF},
	{.name = "body-bytes", .kind = TAP_OPT_U32, .offset = FIELD(body_bytes), .min = 0, .max = 1u << 20, .arg = "N",
	 .def_u32 = 0, .help = "include the first N body bytes in --frames"},
	{.name = "return-window", .kind = TAP_OPT_U32, .offset = FIELD(return_window_ms), .min = 1,
	 .max = 3600u * 1000u, .arg = "MS", .def_u32 = TAP_TRACK_RETURN_WINDOW_US_DEFAULT / 1000,
	 .help = "non-confirm channels: how long a mandatory publish waits for a Return"},
	{.name = "late-return", .kind = TAP_OPT_U32, .offset = FIELD(late_return_ms), .min = 1, .max = 60u * 1000u,
	 .arg = "MS", .def_u32 = TAP_TRACK_LATE_RETURN_US_DEFAULT / 1000,
	 .help = "how long an acked mandatory publish waits for a late Return, and a plain-channel publish for a "
	         "close that refuses it"},
	/* the consumer warnings (amqptap/consume.h) */
	{.name = "stall-after", .kind = TAP_OPT_U32, .offset = FIELD(stall_after_s), .min = 1, .max = 86400u,
	 .arg = "S", .def_u32 = TAP_TRACK_STALL_AFTER_US_DEFAULT / 1000000,
	 .help = "consumer_stalled: a channel with prefetch deliveries unacked and no ack for this long"},
	{.name = "consumer-timeout", .kind = TAP_OPT_U32, .offset = FIELD(consumer_timeout_ms), .min = 1000,
	 .max = UINT32_MAX, .arg = "MS", .def_u32 = (uint32_t)(TAP_TRACK_CONSUMER_TIMEOUT_US_DEFAULT / 1000),
	 .help = "the broker's consumer_timeout: unacked_near_timeout fires at 80 % of it"},
	{.name = "header-values", .kind = TAP_OPT_TEXT, .offset = FIELD(header_values), .arg = "KEY[,KEY...]",
	 .def_shown = "off",
	 .help = "write these headers' values in publish records (header_values; they may hold personal data)"},
	{.name = "identity", .kind = TAP_OPT_TEXT, .offset = FIELD(identity), .arg = "MODE",
	 .def = "auto",
	 .help = "what names a message across reconnects: message_id, body (a fingerprint of exchange, routing key, "
	         "properties and body), auto (the id when it has one, else the fingerprint) or off"},
	{.name = "resend-window", .kind = TAP_OPT_U32, .offset = FIELD(resend_window_ms), .min = 1,
	 .max = 24u * 3600u * 1000u, .arg = "MS", .def_u32 = TAP_TRACK_RESEND_WINDOW_US_DEFAULT / 1000,
	 .help = "how long an unknown publish waits for its resend before a resend_missing record"},
	{.name = "max-outstanding", .kind = TAP_OPT_U32, .offset = FIELD(max_outstanding), .min = 1, .max = UINT32_MAX,
	 .arg = "N", .def_u32 = TAP_TRACK_MAX_OUTSTANDING_DEFAULT,
	 .help = "tracked publishes per connection before the oldest is evicted"},
	{.name = "max-tracking-memory", .kind = TAP_OPT_SIZE, .offset = FIELD(max_tracking_memory), .min = 65536,
	 .max = UINT64_C(1) << 40, .arg = "BYTES", .def = "256M",
	 .help = "tracking state of all connections before the oldest publishes are evicted (K, M, G: KiB, MiB, GiB)"},
	{.name = "grace", .kind = TAP_OPT_U32, .offset = FIELD(grace_ms), .min = 0, .max = 3600u * 1000u, .arg = "MS",
	 .def_u32 = 1000, .help = "on SIGINT/SIGTERM, how long live sessions may finish before they are closed",
	 .modes = TAP_FOR_PROXY},
	{.name = "handshake-timeout", .kind = TAP_OPT_U32, .offset = FIELD(handshake_timeout_ms), .min = 0,
	 .max = 3600u * 1000u, .arg = "MS", .def_u32 = 10000,
	 .help = "longest a client's TLS handshake or the connection to the broker (connect, TLS) may take; 0: no limit",
	 .modes = TAP_FOR_PROXY},
	{.name = "tap-id", .kind = TAP_OPT_ID, .offset = FIELD(tap_id), .arg = "NAME", .def_shown = "the host name",
	 .help = "names this tap in its records (letters, digits and . _ - : @ /)",
	 .modes = TAP_FOR_PROXY | TAP_FOR_SNIFF},
	{.name = "tls-cert", .kind = TAP_OPT_PATH, .offset = FIELD(tls_cert), .arg = "FILE",
	 .help = "accept TLS from clients with this certificate (PEM chain)", .modes = TAP_FOR_PROXY},
	{.name = "tls-key", .kind = TAP_OPT_PATH, .offset = FIELD(tls_key), .arg = "FILE",
	 .help = "private key of --tls-cert (PEM)", .modes = TAP_FOR_PROXY},
	{.name = "tls-client-ca", .kind = TAP_OPT_PATH, .offset = FIELD(tls_client_ca), .arg = "FILE",
	 .help = "require client certificates signed by this CA (PEM)", .modes = TAP_FOR_PROXY},
	{.name = "upstream-tls", .kind = TAP_OPT_FLAG, .offset = FIELD(upstream_tls),
	 .help = "speak TLS to the broker (verification on)", .modes = TAP_FOR_PROXY},
	{.name = "upstream-ca", .kind = TAP_OPT_PATH, .offset = FIELD(upstream_ca), .arg = "FILE",
	 .def_shown = "the system store", .help = "CA bundle for the broker", .modes = TAP_FOR_PROXY},
	{.name = "upstream-sni", .kind = TAP_OPT_TEXT, .offset = FIELD(upstream_sni), .arg = "NAME",
	 .def_shown = "the --upstream host", .help = "server name sent and checked", .modes = TAP_FOR_PROXY},
	{.name = "upstream-cert", .kind = TAP_OPT_PATH, .offset = FIELD(upstream_cert), .arg = "FILE",
	 .help = "client certificate for the broker (mTLS)", .modes = TAP_FOR_PROXY},
	{.name = "upstream-key", .kind = TAP_OPT_PATH, .offset = FIELD(upstream_key), .arg = "FILE",
	 .help = "private key of --upstream-cert", .modes = TAP_FOR_PROXY},
	{.name = "upstream-insecure", .kind = TAP_OPT_FLAG, .offset = FIELD(upstream_insecure),
	 .help = "do not verify the broker's certificate (logged loudly)", .modes = TAP_FOR_PROXY},
	{.name = "upstream-no-reuse", .kind = TAP_OPT_FLAG, .offset = FIELD(upstream_no_reuse),
	 .help = "do not resume the broker's TLS sessions: a full handshake per connection", .modes = TAP_FOR_PROXY},
	{.name = "metrics", .kind = TAP_OPT_ADDR_LOCAL, .offset = FIELD(metrics), .arg = "ADDR:PORT", .def_shown = "off",
	 .help = "serve /metrics (Prometheus), /healthz, /api/status and a live status page at / (PORT alone: loopback)",
	 .modes = TAP_FOR_PROXY | TAP_FOR_SNIFF},
	{.name = "metrics-host", .kind = TAP_OPT_TEXT, .offset = FIELD(metrics_hosts), .arg = "NAME[,...]",
	 .def_shown = "addresses, localhost and this host's name",
	 .help = "further names --metrics answers to in the Host header (others get 403: a web page cannot read it "
	         "through a DNS name of its own)",
	 .modes = TAP_FOR_PROXY | TAP_FOR_SNIFF},
	{.name = "keylog", .kind = TAP_OPT_PATH, .offset = FIELD(keylog), .arg = "FILE", .def_shown = "$SSLKEYLOGFILE",
	 .help = "NSS key log of both TLS legs, mode 0600 (a symbolic link is refused)", .modes = TAP_FOR_PROXY},
	/* --- routing model (issue 36) --- */
	{.name = "definitions", .kind = TAP_OPT_PATH, .offset = FIELD(definitions), .arg = "FILE", .def_shown = "off",
	 .help = "judge every publish by the broker's definitions JSON (rabbitmqctl export_definitions): a topology "
	         "member, dropped_by_topology and topology_mismatch warnings; reloaded on SIGHUP"},
	{.name = "topology-interval", .kind = TAP_OPT_U32, .offset = FIELD(topology_interval_s), .min = 1, .max = 86400,
	 .arg = "S", .def_u32 = TAP_TRACK_TOPOLOGY_INTERVAL_US_DEFAULT / 1000000,
	 .help = "with --definitions or --management: how often dropped_by_topology and topology_mismatch repeat for "
	         "one exchange and routing key, and how often --management is polled"},
	{.name = "management", .kind = TAP_OPT_TEXT, .offset = FIELD(management), .arg = "URL", .def_shown = "off",
	 .help = "poll the definitions from the RabbitMQ management API (http[s]://HOST:PORT), as --definitions judges "
	         "by a file; a failed poll keeps the last good definitions",
	 .modes = TAP_FOR_PROXY | TAP_FOR_SNIFF},
	{.name = "management-credentials", .kind = TAP_OPT_PATH, .offset = FIELD(management_credentials), .arg = "FILE",
	 .def_shown = "none", .help = "a file holding USER:PASSWORD for --management", .modes = TAP_FOR_PROXY | TAP_FOR_SNIFF},
	{.name = "management-ca", .kind = TAP_OPT_PATH, .offset = FIELD(management_ca), .arg = "FILE",
	 .def_shown = "the system store", .help = "CA bundle that verifies an https --management URL",
	 .modes = TAP_FOR_PROXY | TAP_FOR_SNIFF},
	/* fault injection (src/core/fault.c): never on by default */
	{.name = "fault", .kind = TAP_OPT_FAULT, .offset = FIELD(faults), .arg = "ACTION[:KEY=VALUE,...]",
	 .def_shown = "none",
	 .help = "make the client see a failure the broker did not cause (repeatable, at most 16): nack, "
	         "withhold-confirms, delay-confirms:ms=MS, kill[:mode=reset|close], close-channel[:code=C,text=T], "
	         "return, return-after-ack, block:seconds=S, stall-heartbeats, "
	         "latency:ms=MS[,jitter=MS], bandwidth:kib=KIB_PER_S (these two: [dir=up|down|both]); select with conn=, client=, user=, "
	         "vhost=, name=, channel=, exchange=, rk=, every=N, after=N, times=N, p=P[,seed=S], for=SECONDS",
	 .modes = TAP_FOR_PROXY},
	{.name = "fault-api", .kind = TAP_OPT_FLAG, .offset = FIELD(fault_api),
	 .help = "add, list and remove --fault rules at run time on the --metrics endpoint (POST, GET /api/faults, "
	         "DELETE /api/faults/ID); a --metrics address off loopback needs --fault-api-token",
	 .modes = TAP_FOR_PROXY},
	{.name = "fault-api-token", .kind = TAP_OPT_PATH, .offset = FIELD(fault_api_token), .arg = "FILE",
	 .def_shown = "none",
	 .help = "a file (no access for group or others) holding the token /api/faults requires as "
	         "'Authorization: Bearer TOKEN'",
	 .modes = TAP_FOR_PROXY},
	{.name = "quiet", .short_name = 'q', .kind = TAP_OPT_LEVEL, .offset = FIELD(verbosity),
	 .level = TAP_VERBOSITY_QUIET,
	 .help = "only errors and warnings on stderr (no summary at exit; SIGUSR1 still prints it)"},
	{.name = "verbose", .short_name = 'v', .kind = TAP_OPT_LEVEL, .offset = FIELD(verbosity),
	 .level = TAP_VERBOSITY_VERBOSE,
	 .help = "also a line on stderr when a connection opens, reaches the broker (from which local address) and "
	         "closes (the proxy; replay and sniff write their connection records)"},
	{.name = "help", .short_name = 'h', .kind = TAP_OPT_HELP, .help = "show this help and exit"},
	{.name = "version", .short_name = 'V', .kind = TAP_OPT_VERSION,
	 .help = "show the version, git revision and library versions and exit"},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

const struct tap_conf_option *tap_conf_options(size_t *count)
{
	*count = N_OPTIONS;
	return options;
}

int tap_conf_parse_addr(const char *s, enum tap_conf_port ports, struct tap_conf_addr *out)
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
	if (errno || *end || p > 65535 || (p == 0 && ports != TAP_CONF_PORT_ANY))
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

static bool id_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       (ch && strchr("._-:@/", ch));
}

static bool valid_id(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= TAP_CONF_TAP_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!id_char(s[i]))
			return false;
	return true;
}

/* Printable ASCII without spaces, quotes or backslashes. */
static bool valid_text(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s <= ' ' || *s > '~' || *s == '"' || *s == '\'' || *s == '\\')
			return false;
	return true;
}

/* A whole number of bytes with an optional K, M or G (KiB, MiB, GiB; either case, "KiB" etc. too). */
static bool parse_size(const char *value, uint64_t *out)
{
	static const struct {
		const char *suffix;
		unsigned shift;
	} units[] = {{"", 0}, {"k", 10}, {"kib", 10}, {"m", 20}, {"mib", 20}, {"g", 30}, {"gib", 30}};
	if (*value < '0' || *value > '9')
		return false;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(value, &end, 10);
	if (errno)
		return false;
	for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
		if (strcasecmp(end, units[i].suffix) != 0)
			continue;
		if (v > (UINT64_MAX >> units[i].shift))
			return false;
		*out = (uint64_t)v << units[i].shift;
		return true;
	}
	return false;
}

static int apply(struct tap_conf *c, const struct tap_conf_option *o, const char *value, char *err, size_t cap)
{
	char *field = (char *)c + o->offset;
	switch (o->kind) {
	case TAP_OPT_ADDR_LOCAL:
	case TAP_OPT_ADDR_LISTEN:
	case TAP_OPT_ADDR: {
		char local[TAP_CONF_HOST_MAX + 16];
		const char *given = value;
		if (o->kind == TAP_OPT_ADDR_LOCAL && (value[0] == ':' || !strchr(value, ':'))) {
			snprintf(local, sizeof local, "127.0.0.1:%s", value[0] == ':' ? value + 1 : value);
			value = local;
		}
		enum tap_conf_port ports = o->kind != TAP_OPT_ADDR ? TAP_CONF_PORT_ANY : TAP_CONF_PORT_NONZERO;
		if (tap_conf_parse_addr(value, ports, (struct tap_conf_addr *)(void *)field))
			return usage_error(err, cap, "--%s: expected HOST:PORT with a port %s-65535 (IPv6 as [ADDR]:PORT), got '%s'",
					   o->name, o->kind != TAP_OPT_ADDR ? "0" : "1", given);
		return TAP_OK;
	}
	case TAP_OPT_PATH:
		if (!*value)
			return usage_error(err, cap, "--%s: empty file name", o->name);
		*(const char **)(void *)field = value;
		return TAP_OK;
	case TAP_OPT_TEXT:
	case TAP_OPT_IFACE:
		if (!valid_text(value))
			return usage_error(err, cap, "--%s: expected a name without spaces or quotes, got '%s'", o->name,
					   value);
		*(const char **)(void *)field = value;
		return TAP_OK;
	case TAP_OPT_ID:
		if (!valid_id(value))
			return usage_error(err, cap, "--%s: expected 1 to %d letters, digits or . _ - : @ /, got '%s'",
					   o->name, TAP_CONF_TAP_ID_MAX - 1, value);
		memcpy(field, value, strlen(value) + 1);
		return TAP_OK;
	case TAP_OPT_U32:
	case TAP_OPT_PORTS: {
		char *end;
		errno = 0;
		unsigned long long v = (*value >= '0' && *value <= '9') ? strtoull(value, &end, 10) : ULLONG_MAX;
		if (*value < '0' || *value > '9' || errno || *end || v > o->max || v < o->min)
			return usage_error(err, cap, "--%s: expected a whole number from %" PRIu64 " to %" PRIu64 ", got '%s'",
					   o->name, o->min, o->max, value);
		if (o->kind == TAP_OPT_U32) {
			*(uint32_t *)(void *)field = (uint32_t)v;
		} else if (c->n_ports < TAP_CONF_PORTS_MAX) {
			c->ports[c->n_ports++] = (uint16_t)v;
		} else {
			return usage_error(err, cap, "--%s: at most %d", o->name, TAP_CONF_PORTS_MAX);
		}
		return TAP_OK;
	}
	case TAP_OPT_SIZE: {
		uint64_t v;
		if (!parse_size(value, &v) || v > o->max || v < o->min)
			return usage_error(err, cap,
					   "--%s: expected bytes from %" PRIu64 " to %" PRIu64 " (suffix K, M or G allowed), got '%s'",
					   o->name, o->min, o->max, value);
		*(uint64_t *)(void *)field = v;
		return TAP_OK;
	}
	case TAP_OPT_FAULT: {
		struct tap_fault_rule r;
		int rc = tap_fault_parse(value, &r, err, cap); /* its message names the rule */
		if (rc)
			return rc;
		if (c->n_faults == TAP_CONF_FAULTS_MAX)
			return usage_error(err, cap, "--%s: at most %d rules", o->name, TAP_CONF_FAULTS_MAX);
		c->faults[c->n_faults++] = value;
		return TAP_OK;
	}
	case TAP_OPT_FLAG:
		*(bool *)(void *)field = true;
		return TAP_OK;
	case TAP_OPT_LEVEL:
		*(enum tap_conf_verbosity *)(void *)field = o->level;
		return TAP_OK;
	case TAP_OPT_HELP:
		c->mode = TAP_MODE_HELP;
		return TAP_OK;
	case TAP_OPT_VERSION:
		c->mode = TAP_MODE_VERSION;
		return TAP_OK;
	}
	return TAP_E_USAGE;
}

static void default_tap_id(struct tap_conf *c)
{
	char host[TAP_CONF_TAP_ID_MAX] = "";
	if (gethostname(host, sizeof host - 1) != 0 || !valid_id(host))
		snprintf(host, sizeof host, "unknown");
	memcpy(c->tap_id, host, sizeof host);
}

void tap_conf_defaults(struct tap_conf *c)
{
	memset(c, 0, sizeof *c);
	c->mode = TAP_MODE_PROXY;
	c->verbosity = TAP_VERBOSITY_NORMAL;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct tap_conf_option *o = &options[i];
		char ignored[160];
		if (o->kind == TAP_OPT_U32)
			*(uint32_t *)(void *)((char *)c + o->offset) = o->def_u32;
		else if (o->def)
			(void)apply(c, o, o->def, ignored, sizeof ignored); /* test_conf checks every default parses */
	}
	default_tap_id(c);
}

static const struct tap_conf_option *find_short(int ch)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (options[i].short_name && options[i].short_name == ch)
			return &options[i];
	return NULL;
}

static bool takes_value(const struct tap_conf_option *o)
{
	return o->arg != NULL;
}

/* getopt_long returns this for the long form of options[i], and the letter for a short form. */
#define LONG_VAL(i) (256 + (int)(i))

/* "-:" first: non-options come back in order as 1 (argv is never permuted, whatever POSIXLY_CORRECT says),
 * and a missing value as ':' rather than '?'. */
static void build_getopt(struct option *longopts, char *shortopts)
{
	size_t n = 0;
	shortopts[n++] = '-';
	shortopts[n++] = ':';
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct tap_conf_option *o = &options[i];
		int has_arg = takes_value(o) ? required_argument : no_argument;
		longopts[i] = (struct option){o->name, has_arg, NULL, LONG_VAL(i)};
		if (o->short_name) {
			shortopts[n++] = o->short_name;
			if (takes_value(o))
				shortopts[n++] = ':';
		}
	}
	longopts[N_OPTIONS] = (struct option){NULL, 0, NULL, 0};
	shortopts[n] = '\0';
}

/* The element of argv that getopt_long just read a long option from. */
static const char *long_element(const struct tap_conf_option *o, char **argv)
{
	bool value_in_next = takes_value(o) && optarg == argv[optind - 1];
	return argv[optind - (value_in_next ? 2 : 1)];
}

/* getopt_long takes any unambiguous prefix (--list for --listen); a prefix would break when a later option
 * shares it, so only the full name is accepted. */
static bool spelled_out(const struct tap_conf_option *o, const char *element)
{
	size_t len = strlen(o->name);
	return strncmp(element, "--", 2) == 0 && strncmp(element + 2, o->name, len) == 0 &&
	       (element[2 + len] == '\0' || element[2 + len] == '=');
}

static int unknown_long(const char *element, char *err, size_t cap)
{
	int len = (int)strcspn(element, "=");
	return usage_error(err, cap, "%.*s: unknown option (see --help)", len, element);
}

/* getopt_long's '?' (an unknown option, or a value given to one that takes none) and ':' (a value missing). */
static int getopt_error(int ch, char **argv, char *err, size_t cap)
{
	const struct tap_conf_option *o = NULL;
	if (optopt >= LONG_VAL(0) && optopt < LONG_VAL(N_OPTIONS))
		o = &options[optopt - LONG_VAL(0)];
	else if (optopt > 0)
		o = find_short(optopt);
	if (o && ch == ':')
		return usage_error(err, cap, "--%s: missing value %s", o->name, o->arg);
	if (o)
		return usage_error(err, cap, "--%s: takes no value", o->name);
	if (optopt > 0)
		return usage_error(err, cap, "-%c: unknown option (see --help)", optopt);
	return unknown_long(argv[optind - 1], err, cap);
}

/* The arguments that are not options, at their place among them: the first (0) may name a subcommand; replay then
 * takes the capture. */
static int positional(struct tap_conf *c, const char *a, int place, char *err, size_t cap)
{
	bool first = place == 0;
	if (first && strcmp(a, "replay") == 0) {
		c->mode = TAP_MODE_REPLAY;
		return TAP_OK;
	}
	if (first && strcmp(a, "sniff") == 0) {
		c->mode = TAP_MODE_SNIFF;
		return TAP_OK;
	}
	if (c->mode == TAP_MODE_REPLAY && !c->replay_file) {
		c->replay_file = a;
		return TAP_OK;
	}
	return usage_error(err, cap, "'%s': unexpected argument (see --help)", a);
}

/* --header-values: at most TAP_TRACK_HEADER_VALUES_KEYS_MAX keys, none empty, none twice (a record would hold one
 * key twice, or crowd out one that was asked for). */
static int check_header_values(const char *list, char *err, size_t cap)
{
	const char *keys[TAP_TRACK_HEADER_VALUES_KEYS_MAX];
	size_t lens[TAP_TRACK_HEADER_VALUES_KEYS_MAX], n = 0;
	for (const char *k = list;; k++) {
		const char *end = strchr(k, ',');
		size_t len = end ? (size_t)(end - k) : strlen(k);
		if (len == 0)
			return usage_error(err, cap, "--header-values: an empty key in '%s'", list);
		if (n == TAP_TRACK_HEADER_VALUES_KEYS_MAX)
			return usage_error(err, cap, "--header-values: at most %u keys", TAP_TRACK_HEADER_VALUES_KEYS_MAX);
		for (size_t i = 0; i < n; i++)
			if (lens[i] == len && memcmp(keys[i], k, len) == 0)
				return usage_error(err, cap, "--header-values: '%.*s' given twice", (int)len, k);
		keys[n] = k;
		lens[n++] = len;
		if (!end)
			return TAP_OK;
		k = end;
	}
}

/* Every option given is one for the mode (tap_conf_option.modes): a proxy option given to replay would be ignored
 * without a word. */
static int check_modes(const struct tap_conf *c, const bool given[N_OPTIONS], char *err, size_t cap)
{
	unsigned mode = c->mode == TAP_MODE_REPLAY  ? TAP_FOR_REPLAY
			: c->mode == TAP_MODE_SNIFF ? TAP_FOR_SNIFF
						    : TAP_FOR_PROXY;
	for (size_t i = 0; i < N_OPTIONS; i++) {
		unsigned m = options[i].modes;
		if (!given[i] || !m || (m & mode))
			continue;
		const char *where = m == TAP_FOR_PROXY                    ? "the proxy (amqptap without 'replay' or 'sniff')"
				    : m == TAP_FOR_SNIFF                    ? "'amqptap sniff'"
				    : m == (TAP_FOR_REPLAY | TAP_FOR_SNIFF) ? "'amqptap replay' and 'amqptap sniff'"
									    : "the proxy and 'amqptap sniff'";
		return usage_error(err, cap, "--%s: only for %s", options[i].name, where);
	}
	return TAP_OK;
}

/* The directory part of path, whose last component starts at base ("." for none). */
static void dir_part(const char *path, const char *base, char out[PATH_MAX])
{
	if (base == path)
		snprintf(out, PATH_MAX, ".");
	else
		snprintf(out, PATH_MAX, "%.*s", (int)(base - path), path);
}

/* Whether a and b name one file: the same text ("-" is standard output), the same existing file (links, ./x and
 * x), or a file not made yet under one name in one directory (the outputs are created only after this check). The
 * file system is the caller's to look at (same_inode; NULL: the names alone decide). */
static bool same_file(const char *a, const char *b, tap_conf_same_inode_fn same_inode)
{
	if (strcmp(a, b) == 0)
		return true;
	if (strcmp(a, "-") == 0 || strcmp(b, "-") == 0 || !same_inode)
		return false;
	if (same_inode(a, b))
		return true;
	const char *base_a = strrchr(a, '/'), *base_b = strrchr(b, '/');
	base_a = base_a ? base_a + 1 : a;
	base_b = base_b ? base_b + 1 : b;
	if (strcmp(base_a, base_b) != 0)
		return false;
	char dir_a[PATH_MAX], dir_b[PATH_MAX];
	dir_part(a, base_a, dir_a);
	dir_part(b, base_b, dir_b);
	return same_inode(dir_a, dir_b);
}

/* No two outputs in one file (JSON Lines and pcapng mixed on standard output, two writers appending to one file)
 * and none into the capture being replayed. */
static int check_outputs(const struct tap_conf *c, tap_conf_same_inode_fn same_inode, char *err, size_t cap)
{
	const struct {
		const char *name, *path;
	} out[] = {{"verdicts", c->verdicts}, {"frames", c->frames}, {"pcap", c->pcap}, {"keylog", c->keylog}};
	const size_t n = sizeof out / sizeof out[0];
	for (size_t i = 0; i < n; i++) {
		if (!out[i].path)
			continue;
		if (c->mode == TAP_MODE_REPLAY && c->replay_file && strcmp(c->replay_file, "-") != 0 &&
		    same_file(out[i].path, c->replay_file, same_inode))
			return usage_error(err, cap, "--%s: %s is the capture being replayed", out[i].name, out[i].path);
		for (size_t k = 0; k < i; k++) {
			if (!out[k].path || !same_file(out[k].path, out[i].path, same_inode))
				continue;
			if (strcmp(out[i].path, "-") == 0)
				return usage_error(err, cap, "--%s: standard output is --%s's already%s", out[i].name,
						   out[k].name, k == 0 ? " (its default: give --verdicts FILE)" : "");
			return usage_error(err, cap, "--%s: %s is --%s's file already", out[i].name, out[i].path,
					   out[k].name);
		}
	}
	return TAP_OK;
}

/* Options that only make sense together. */
static int check_combinations(const struct tap_conf *c, tap_conf_same_inode_fn same_inode, char *err, size_t cap)
{
	int rc = check_outputs(c, same_inode, err, cap);
	if (rc)
		return rc;
	if (!c->tls_cert != !c->tls_key)
		return usage_error(err, cap, "%s: --tls-cert and --tls-key go together",
				   c->tls_cert ? "--tls-cert" : "--tls-key");
	if (c->tls_client_ca && !c->tls_cert)
		return usage_error(err, cap, "--tls-client-ca: needs --tls-cert and --tls-key");
	if (!c->upstream_cert != !c->upstream_key)
		return usage_error(err, cap, "%s: --upstream-cert and --upstream-key go together",
				   c->upstream_cert ? "--upstream-cert" : "--upstream-key");
	const char *needs_tls = c->upstream_ca ? "--upstream-ca"
				: c->upstream_sni ? "--upstream-sni"
				: c->upstream_cert ? "--upstream-cert"
				: c->upstream_insecure ? "--upstream-insecure"
				: c->upstream_no_reuse ? "--upstream-no-reuse"
				: NULL;
	if (needs_tls && !c->upstream_tls)
		return usage_error(err, cap, "%s: needs --upstream-tls", needs_tls);
	if (c->upstream_insecure && c->upstream_ca) /* the CA would be silently ignored */
		return usage_error(err, cap, "--upstream-insecure: verifies nothing, so --upstream-ca would not be used");
	if (c->keylog && !c->tls_cert && !c->upstream_tls)
		return usage_error(err, cap, "--keylog: needs TLS on a leg (--tls-cert or --upstream-tls)");
	if (c->identity && tap_conf_identity_mode(c) < 0)
		return usage_error(err, cap, "--identity: expected auto, message_id, body or off, got '%s'", c->identity);
	if (c->header_values)
		return check_header_values(c->header_values, err, cap);
	return TAP_OK;
}

int tap_conf_identity_mode(const struct tap_conf *c)
{
	static const char *const names[] = {"auto", "message_id", "body", "off"}; /* enum tap_identity_mode */
	if (!c->identity)
		return 0;
	for (int i = 0; i < 4; i++)
		if (!strcmp(c->identity, names[i]))
			return i;
	return -1;
}

int tap_conf_parse(struct tap_conf *c, int argc, char **argv, tap_conf_same_inode_fn same_inode, char *err,
		   size_t cap)
{
	struct option longopts[N_OPTIONS + 1];
	char shortopts[2 + 2 * N_OPTIONS + 1];
	build_getopt(longopts, shortopts);
	bool given[N_OPTIONS] = {false};
	int positionals = 0;
	int rc;
	opterr = 0; /* our one-line messages replace getopt's */
	optind = 0; /* glibc: start over, as for a new argv */
	for (;;) {
		int ch = getopt_long(argc, argv, shortopts, longopts, NULL);
		if (ch == -1)
			break;
		if (ch == 1) {
			rc = positional(c, optarg, positionals++, err, cap);
			if (rc)
				return rc;
			continue;
		}
		if (ch == '?' || ch == ':')
			return getopt_error(ch, argv, err, cap);
		const struct tap_conf_option *o = ch >= LONG_VAL(0) ? &options[ch - LONG_VAL(0)] : find_short(ch);
		if (ch >= LONG_VAL(0) && !spelled_out(o, long_element(o, argv)))
			return unknown_long(long_element(o, argv), err, cap);
		given[o - options] = true;
		rc = apply(c, o, optarg, err, cap);
		if (rc)
			return rc;
		if (c->mode == TAP_MODE_HELP || c->mode == TAP_MODE_VERSION)
			return TAP_OK;
	}
	for (int i = optind; i < argc; i++) { /* after "--" */
		rc = positional(c, argv[i], positionals++, err, cap);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < N_OPTIONS && c->n_ports == 0; i++)
		if (options[i].kind == TAP_OPT_PORTS)
			c->ports[c->n_ports++] = (uint16_t)options[i].def_u32;
	if ((rc = check_modes(c, given, err, cap)))
		return rc;
	if (c->mode == TAP_MODE_SNIFF && !c->interface)
		return usage_error(err, cap, "sniff: missing --interface (amqptap sniff --interface IF [--port N])");
	if (c->mode == TAP_MODE_REPLAY && !c->replay_file)
		return usage_error(err, cap, "replay: missing the CAPTURE file (amqptap replay CAPTURE [--port N])");
	if (c->management && c->definitions)
		return usage_error(err, cap, "--management: the definitions come from --definitions or --management, not both");
	if (c->fault_api && !c->metrics.host[0])
		return usage_error(err, cap, "--fault-api: needs --metrics (the endpoint it is served on)");
	if (c->fault_api_token && !c->fault_api)
		return usage_error(err, cap, "--fault-api-token: only with --fault-api");
	if ((c->management_credentials || c->management_ca) && !c->management)
		return usage_error(err, cap, "--%s: only with --management",
				   c->management_credentials ? "management-credentials" : "management-ca");
	return check_combinations(c, same_inode, err, cap);
}
