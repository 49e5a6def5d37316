/* The option table: defaults (from the table, the tracker's where they are the tracker's), every accepted form
 * of getopt_long, one clear message naming the option for every bad one, and --help, the man page and the
 * bash completion listing exactly the options of the table. */
#include "amqptap/conf.h"
#include "amqptap/files.h"
#include "amqptap/status.h"
#include "amqptap/track.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse(struct tap_conf *c, char *err, size_t cap, int argc, char **argv)
{
	tap_conf_defaults(c);
	return tap_conf_parse(c, argc, argv, tap_files_same_inode, err, cap);
}

#define PARSE(c, err, ...)                                                                                      \
	({                                                                                                      \
		char *argv_[] = {"amqptap", __VA_ARGS__};                                                       \
		parse(c, err, sizeof err, (int)(sizeof argv_ / sizeof argv_[0]), argv_);                        \
	})

static const struct tap_conf_option *option_named(const char *name)
{
	size_t n;
	const struct tap_conf_option *opts = tap_conf_options(&n);
	for (size_t i = 0; i < n; i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

START_TEST(defaults)
{
	struct tap_conf c;
	char err[256] = "";
	char *argv[] = {"amqptap"};
	ck_assert_int_eq(parse(&c, err, sizeof err, 1, argv), TAP_OK);
	ck_assert_str_eq(c.listen.host, "127.0.0.1");
	ck_assert_uint_eq(c.listen.port, 5673);
	ck_assert_str_eq(c.upstream.host, "127.0.0.1");
	ck_assert_uint_eq(c.upstream.port, 5672);
	ck_assert_str_eq(c.verdicts, "-");
	ck_assert_ptr_null(c.frames);
	ck_assert_uint_eq(c.return_window_ms, 2000);
	ck_assert_uint_eq(c.max_outstanding, 1000000);
	ck_assert_uint_eq(c.grace_ms, 1000);
	ck_assert_uint_eq(c.ports[0], 5672);
	ck_assert_int_eq(c.mode, TAP_MODE_PROXY);
	ck_assert_int_eq(c.verbosity, TAP_VERBOSITY_NORMAL);
	char host[TAP_CONF_TAP_ID_MAX] = "";
	ck_assert_int_eq(gethostname(host, sizeof host - 1), 0);
	ck_assert_str_eq(c.tap_id, host);
}
END_TEST

/* The tracker's defaults are the table's: one place for each. */
START_TEST(tracker_defaults_come_from_track_h)
{
	struct tap_conf c;
	tap_conf_defaults(&c);
	ck_assert_uint_eq((uint64_t)c.return_window_ms * 1000, TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
	ck_assert_uint_eq((uint64_t)c.late_return_ms * 1000, TAP_TRACK_LATE_RETURN_US_DEFAULT);
	ck_assert_uint_eq(c.max_outstanding, TAP_TRACK_MAX_OUTSTANDING_DEFAULT);
	ck_assert_uint_eq(c.max_tracking_memory, TAP_TRACK_MAX_MEMORY_DEFAULT);
	ck_assert_uint_eq(option_named("return-window")->def_u32 * 1000u, TAP_TRACK_RETURN_WINDOW_US_DEFAULT);
}
END_TEST

/* Every default written as text in the table is a value the parser accepts for its option, and lands in
 * the field as tap_conf_defaults puts it there. */
START_TEST(every_default_parses)
{
	size_t n;
	const struct tap_conf_option *opts = tap_conf_options(&n);
	for (size_t i = 0; i < n; i++) {
		if (!opts[i].def)
			continue;
		ck_assert_ptr_nonnull(opts[i].arg);
		char flag[64];
		snprintf(flag, sizeof flag, "--%s", opts[i].name);
		struct tap_conf c, d;
		char err[256] = "";
		char *argv[] = {"amqptap", flag, (char *)opts[i].def};
		ck_assert_msg(parse(&c, err, sizeof err, 3, argv) == TAP_OK, "default of %s: %s", flag, err);
		tap_conf_defaults(&d);
		ck_assert_int_eq(memcmp((char *)&c + opts[i].offset, (char *)&d + opts[i].offset, sizeof(void *)), 0);
	}
}
END_TEST

START_TEST(accepted_forms)
{
	struct tap_conf c;
	char err[256] = "";
	ck_assert_int_eq(PARSE(&c, err, "--listen", "0.0.0.0:6000", "--upstream=[::1]:5671", "-o", "v.jsonl",
			       "--frames=f.jsonl", "--return-window", "10", "--max-outstanding=5"),
			 TAP_OK);
	ck_assert_str_eq(c.listen.host, "0.0.0.0");
	ck_assert_uint_eq(c.listen.port, 6000);
	ck_assert_str_eq(c.upstream.host, "::1");
	ck_assert_uint_eq(c.upstream.port, 5671);
	ck_assert_str_eq(c.verdicts, "v.jsonl");
	ck_assert_str_eq(c.frames, "f.jsonl");
	ck_assert_uint_eq(c.return_window_ms, 10);
	ck_assert_uint_eq(c.max_outstanding, 5);
	ck_assert_int_eq(PARSE(&c, err, "--listen", "localhost:0"), TAP_OK);
	ck_assert_uint_eq(c.listen.port, 0);
	ck_assert_int_eq(PARSE(&c, err, "-h"), TAP_OK);
	ck_assert_int_eq(c.mode, TAP_MODE_HELP);
	ck_assert_int_eq(PARSE(&c, err, "--version"), TAP_OK);
	ck_assert_int_eq(c.mode, TAP_MODE_VERSION);
	ck_assert_int_eq(PARSE(&c, err, "-V"), TAP_OK);
	ck_assert_int_eq(c.mode, TAP_MODE_VERSION);
}
END_TEST

/* Byte sizes: plain bytes or K, M, G (powers of 1024), either case, with or without "iB". */
START_TEST(byte_sizes)
{
	static const struct {
		const char *in;
		uint64_t bytes;
	} cases[] = {{"65536", 65536}, {"64k", 65536}, {"64KiB", 65536}, {"300M", UINT64_C(300) << 20},
	             {"300mib", UINT64_C(300) << 20}, {"4G", UINT64_C(4) << 30}, {"1024G", UINT64_C(1) << 40}};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct tap_conf c;
		char err[256] = "";
		ck_assert_msg(PARSE(&c, err, "--max-tracking-memory", (char *)cases[i].in) == TAP_OK, "%s: %s", cases[i].in, err);
		ck_assert_uint_eq(c.max_tracking_memory, cases[i].bytes);
	}
}
END_TEST

START_TEST(short_forms_and_bundles)
{
	struct tap_conf c;
	char err[256] = "";
	/* a short option's value attached, or in the next argument even when it is "-" */
	ck_assert_int_eq(PARSE(&c, err, "-ov.jsonl", "-f", "-", "-l127.0.0.1:7000"), TAP_OK);
	ck_assert_str_eq(c.verdicts, "v.jsonl");
	ck_assert_str_eq(c.frames, "-");
	ck_assert_uint_eq(c.listen.port, 7000);
	/* bundles: the later flag wins */
	ck_assert_int_eq(PARSE(&c, err, "-vq"), TAP_OK);
	ck_assert_int_eq(c.verbosity, TAP_VERBOSITY_QUIET);
	ck_assert_int_eq(PARSE(&c, err, "-qv"), TAP_OK);
	ck_assert_int_eq(c.verbosity, TAP_VERBOSITY_VERBOSE);
	/* a bundle may end in an option that takes a value */
	ck_assert_int_eq(PARSE(&c, err, "-vo", "x.jsonl"), TAP_OK);
	ck_assert_int_eq(c.verbosity, TAP_VERBOSITY_VERBOSE);
	ck_assert_str_eq(c.verdicts, "x.jsonl");
	ck_assert_int_eq(PARSE(&c, err, "-qox.jsonl"), TAP_OK);
	ck_assert_int_eq(c.verbosity, TAP_VERBOSITY_QUIET);
	ck_assert_str_eq(c.verdicts, "x.jsonl");
	ck_assert_int_eq(PARSE(&c, err, "--quiet", "--verbose"), TAP_OK);
	ck_assert_int_eq(c.verbosity, TAP_VERBOSITY_VERBOSE);
	/* later options override earlier ones */
	ck_assert_int_eq(PARSE(&c, err, "-o", "a", "--verdicts=b"), TAP_OK);
	ck_assert_str_eq(c.verdicts, "b");
}
END_TEST

START_TEST(replay_and_double_dash)
{
	struct tap_conf c;
	char err[256] = "";
	ck_assert_int_eq(PARSE(&c, err, "replay", "cap.pcapng", "--port", "5671"), TAP_OK);
	ck_assert_int_eq(c.mode, TAP_MODE_REPLAY);
	ck_assert_str_eq(c.replay_file, "cap.pcapng");
	ck_assert_uint_eq(c.ports[0], 5671);
	/* options before the subcommand, and after the capture */
	ck_assert_int_eq(PARSE(&c, err, "-q", "replay", "--port=1", "cap.pcap", "-o", "out"), TAP_OK);
	ck_assert_int_eq(c.mode, TAP_MODE_REPLAY);
	ck_assert_str_eq(c.replay_file, "cap.pcap");
	ck_assert_uint_eq(c.ports[0], 1);
	ck_assert_str_eq(c.verdicts, "out");
	/* after "--" a name that looks like an option is the capture */
	ck_assert_int_eq(PARSE(&c, err, "replay", "--port", "5672", "--", "-odd.pcap"), TAP_OK);
	ck_assert_str_eq(c.replay_file, "-odd.pcap");
	ck_assert_int_eq(PARSE(&c, err, "replay", "-"), TAP_OK);
	ck_assert_str_eq(c.replay_file, "-");
	/* POSIXLY_CORRECT would stop getopt at the first non-option: the table's parser does not */
	setenv("POSIXLY_CORRECT", "1", 1);
	int rc = PARSE(&c, err, "replay", "cap.pcap", "--port", "5671");
	unsetenv("POSIXLY_CORRECT");
	ck_assert_int_eq(rc, TAP_OK);
	ck_assert_uint_eq(c.ports[0], 5671);
	/* "--" alone changes nothing */
	ck_assert_int_eq(PARSE(&c, err, "-v", "--"), TAP_OK);
	ck_assert_int_eq(c.mode, TAP_MODE_PROXY);
	/* --port repeats: every one kept in order; without it, the default alone */
	ck_assert_int_eq(PARSE(&c, err, "sniff", "-i", "lo", "--port", "5673", "--port=5672", "--port", "15672"), TAP_OK);
	ck_assert_uint_eq(c.n_ports, 3);
	ck_assert_uint_eq(c.ports[0], 5673);
	ck_assert_uint_eq(c.ports[1], 5672);
	ck_assert_uint_eq(c.ports[2], 15672);
	ck_assert_int_eq(PARSE(&c, err, "sniff", "-i", "lo"), TAP_OK);
	ck_assert_uint_eq(c.n_ports, 1);
	ck_assert_uint_eq(c.ports[0], 5672);
	char *many[3 + 2 * (TAP_CONF_PORTS_MAX + 1)];
	char num[TAP_CONF_PORTS_MAX + 1][8];
	many[0] = "amqptap";
	many[1] = "replay";
	many[2] = "cap.pcap";
	for (int i = 0; i <= TAP_CONF_PORTS_MAX; i++) {
		snprintf(num[i], sizeof num[i], "%d", 1000 + i);
		many[3 + 2 * i] = "--port";
		many[4 + 2 * i] = num[i];
	}
	ck_assert_int_eq(parse(&c, err, sizeof err, 3 + 2 * TAP_CONF_PORTS_MAX, many), TAP_OK);
	ck_assert_uint_eq(c.n_ports, TAP_CONF_PORTS_MAX);
	ck_assert_uint_eq(c.ports[TAP_CONF_PORTS_MAX - 1], 1000 + TAP_CONF_PORTS_MAX - 1);
	ck_assert_int_eq(parse(&c, err, sizeof err, 3 + 2 * (TAP_CONF_PORTS_MAX + 1), many), TAP_E_USAGE);
	ck_assert_str_eq(err, "--port: at most 16");
}
END_TEST

START_TEST(tap_id)
{
	struct tap_conf c;
	char err[256] = "";
	ck_assert_int_eq(PARSE(&c, err, "--tap-id", "node-1.dc2:5672"), TAP_OK);
	ck_assert_str_eq(c.tap_id, "node-1.dc2:5672");
	ck_assert_int_eq(PARSE(&c, err, "--tap-id=eu/rabbit@a_b"), TAP_OK);
	ck_assert_str_eq(c.tap_id, "eu/rabbit@a_b");
	char longest[TAP_CONF_TAP_ID_MAX];
	memset(longest, 'x', sizeof longest - 1);
	longest[sizeof longest - 1] = '\0';
	ck_assert_int_eq(PARSE(&c, err, "--tap-id", longest), TAP_OK);
	ck_assert_str_eq(c.tap_id, longest);
	char too_long[TAP_CONF_TAP_ID_MAX + 1];
	memset(too_long, 'x', sizeof too_long - 1);
	too_long[sizeof too_long - 1] = '\0';
	ck_assert_int_eq(PARSE(&c, err, "--tap-id", too_long), TAP_E_USAGE);
	ck_assert_ptr_nonnull(strstr(err, "--tap-id"));
}
END_TEST

struct bad_case {
	const char *args[4];
	const char *names; /* the message must contain this */
};

static const struct bad_case bad_cases[] = {
	{{"--listen", "nonsense"}, "--listen"},
	{{"--listen", "127.0.0.1:70000"}, "--listen"},
	{{"--upstream", "127.0.0.1:0"}, "--upstream"},
	{{"--upstream", "::1:5672"}, "--upstream"},
	{{"--upstream", ":5672"}, "--upstream"},
	{{"--upstream=:5672"}, "--upstream"},
	{{"--bogus-flag"}, "--bogus-flag"},
	{{"--bogus-flag=3"}, "--bogus-flag"},
	{{"-z"}, "-z"},
	{{"-vz"}, "-z"},
	{{"--return-window", "-5"}, "--return-window"},
	{{"--return-window", "12ms"}, "--return-window"},
	{{"--return-window="}, "--return-window"},
	{{"--max-outstanding", "99999999999"}, "--max-outstanding"},
	{{"--max-outstanding", "0"}, "--max-outstanding"},
	{{"--late-return", "0"}, "--late-return"},
	{{"--max-tracking-memory", "1T"}, "--max-tracking-memory"},
	{{"--max-tracking-memory", "64"}, "--max-tracking-memory"},       /* below 64 KiB */
	{{"--max-tracking-memory", "2048G"}, "--max-tracking-memory"},    /* above 1 TiB */
	{{"--max-tracking-memory", "18014398509481984K"}, "--max-tracking-memory"}, /* overflows */
	{{"--max-tracking-memory", "M"}, "--max-tracking-memory"},
	{{"--max-tracking-memory", "-1M"}, "--max-tracking-memory"},
	{{"--port", "5672"}, "--port"},
	{{"replay"}, "replay"},
	{{"replay", "a.pcap", "b.pcap"}, "b.pcap"},
	{{"--verdicts"}, "--verdicts"},
	{{"-o"}, "--verdicts"},
	{{"-vo"}, "--verdicts"},
	{{"--verdicts", ""}, "--verdicts"},
	{{"--verdicts="}, "--verdicts"},
	{{"--help=yes"}, "--help"},
	{{"--quiet=1"}, "--quiet"},
	{{"--upstream-tls=yes"}, "--upstream-tls"},
	{{"stray"}, "stray"},
	{{"--", "stray"}, "stray"},
	{{"--list", "127.0.0.1:1"}, "--list"},      /* no abbreviations */
	{{"--verb"}, "--verb"},                      /* unambiguous prefix of --verbose: still refused */
	{{"--upstream-c", "x"}, "--upstream-c"},     /* ambiguous prefix */
	{{"--tap-id", "two words"}, "--tap-id"},
	{{"--tap-id", ""}, "--tap-id"},
	{{"--tap-id", "a\"b"}, "--tap-id"},
	{{"--upstream-tls", "--upstream-sni", "a b"}, "--upstream-sni"},
	{{"--upstream-tls", "--upstream-insecure", "--upstream-ca", "ca.pem"}, "--upstream-insecure"}, /* CA unused */
	{{"--tls-cert", "c.pem"}, "--tls-cert"},
	{{"--keylog", "k.log"}, "--keylog"}, /* no TLS leg to log */
	{{"--header-values", "a,b,c,d,e,f,g,h,i"}, "--header-values"}, /* more than 8 */
	{{"--header-values", ",,a"}, "--header-values"},
	{{"--header-values", "a,"}, "--header-values"},
	{{"--header-values", "a,b,a"}, "--header-values"},
	/* an option of another mode would be ignored without a word */
	{{"replay", "x.pcap", "--listen", "127.0.0.1:1"}, "--listen"},
	{{"replay", "x.pcap", "--metrics", "9000"}, "--metrics"},
	{{"sniff", "-i", "lo", "--upstream-tls"}, "--upstream-tls"},
	{{"sniff", "-i", "lo", "--grace=5"}, "--grace"},
	{{"replay", "x.pcap", "--tap-id", "a"}, "--tap-id"},
	{{"-i", "lo"}, "--interface: only for 'amqptap sniff'"},
	{{"--buffer-size", "1024"}, "--buffer-size"},
	/* --fault-api: served on --metrics; its token only with it; the proxy's alone */
	{{"--fault-api"}, "--fault-api: needs --metrics"},
	{{"--metrics", "9000", "--fault-api-token", "t"}, "--fault-api-token: only with --fault-api"},
	{{"sniff", "-i", "lo", "--fault-api"}, "--fault-api: only for the proxy"},
	/* two outputs in one file, or one into the capture being replayed */
	{{"--pcap", "-"}, "--pcap: standard output is --verdicts's"},
	{{"-ov.json", "-f", "-", "--pcap=-"}, "--pcap: standard output is --frames's"},
	{{"-o", "same.out", "--pcap", "same.out"}, "--pcap: same.out is --verdicts's file"},
	{{"replay", "x.pcap", "-o", "x.pcap"}, "--verdicts: x.pcap is the capture being replayed"},
	/* files not made yet: one name in one directory, spelt two ways */
	{{"-o", "tap-not-made.out", "--pcap", "./tap-not-made.out"}, "--pcap: ./tap-not-made.out is --verdicts's file"},
	{{"-f", "/tmp/../tmp/tap-not-made.out", "--pcap", "/tmp/tap-not-made.out"}, "is --frames's file"},
};

/* Two outputs not made yet under different names, or the same name in different directories, are two files. */
START_TEST(outputs_not_made_yet_apart)
{
	char *argv[][5] = {{"amqptap", "-o", "tap-not-made-a.out", "--pcap", "tap-not-made-b.out"},
			   {"amqptap", "-o", "/proc/tap-not-made.out", "--pcap", "tap-not-made.out"}};
	for (size_t i = 0; i < 2; i++) {
		struct tap_conf c;
		char err[256] = "";
		ck_assert_msg(parse(&c, err, sizeof err, 5, argv[i]) == TAP_OK, "%s", err);
	}
}
END_TEST

START_TEST(bad_options_name_themselves)
{
	const struct bad_case *bc = &bad_cases[_i];
	char *argv[5] = {"amqptap"};
	int argc = 1;
	for (int k = 0; k < 4 && bc->args[k]; k++)
		argv[argc++] = (char *)bc->args[k];
	struct tap_conf c;
	char err[256] = "";
	ck_assert_int_eq(parse(&c, err, sizeof err, argc, argv), TAP_E_USAGE);
	ck_assert_msg(strstr(err, bc->names) != NULL, "message '%s' does not name '%s'", err, bc->names);
	ck_assert_ptr_null(strchr(err, '\n'));
}
END_TEST

/* ---- the renderings list exactly the table ---- */

#define MAX_NAMES 128

struct names {
	char v[MAX_NAMES][40];
	size_t n;
};

static int cmp_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

static void names_add(struct names *s, const char *name, size_t len)
{
	ck_assert_uint_lt(s->n, MAX_NAMES);
	ck_assert_uint_lt(len, sizeof s->v[0]);
	memcpy(s->v[s->n], name, len);
	s->v[s->n][len] = '\0';
	s->n++;
}

/* "--name" and "-c" of every row, sorted. */
static void table_names(struct names *s)
{
	size_t n;
	const struct tap_conf_option *opts = tap_conf_options(&n);
	s->n = 0;
	for (size_t i = 0; i < n; i++) {
		char buf[40];
		snprintf(buf, sizeof buf, "--%s", opts[i].name);
		names_add(s, buf, strlen(buf));
		if (opts[i].short_name) {
			snprintf(buf, sizeof buf, "-%c", opts[i].short_name);
			names_add(s, buf, 2);
		}
	}
	qsort(s->v, s->n, sizeof s->v[0], cmp_name);
}

static void assert_same_names(struct names *got, const char *what)
{
	struct names want;
	table_names(&want);
	qsort(got->v, got->n, sizeof got->v[0], cmp_name);
	for (size_t i = 0; i < want.n || i < got->n; i++) {
		const char *w = i < want.n ? want.v[i] : "(none)";
		const char *g = i < got->n ? got->v[i] : "(none)";
		ck_assert_msg(strcmp(w, g) == 0, "%s: option %zu is %s, the table's is %s", what, i, g, w);
	}
}

static char *render_usage(void)
{
	size_t len = tap_conf_usage(NULL, 0);
	char *out = malloc(len + 1);
	ck_assert_uint_eq(tap_conf_usage(out, len + 1), len);
	ck_assert_uint_eq(strlen(out), len);
	return out;
}

/* Option lines of --help: "  -l, --listen ADDR:PORT   text" and "  --pcap FILE   text". */
START_TEST(usage_lists_exactly_the_table)
{
	char *out = render_usage();
	struct names got = {.n = 0};
	for (char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
		if (strncmp(line, "  -", 3) != 0)
			continue;
		const char *p = line + 2;
		if (p[1] != '-') { /* "-l, " */
			names_add(&got, p, 2);
			p += 4;
		}
		names_add(&got, p, strcspn(p, " \n"));
	}
	assert_same_names(&got, "--help");
	const char *rw = strstr(out, "--return-window MS");
	ck_assert_ptr_nonnull(rw);
	char want[32];
	snprintf(want, sizeof want, "(default: %u)", TAP_TRACK_RETURN_WINDOW_US_DEFAULT / 1000);
	ck_assert_ptr_nonnull(strstr(rw, want));
	ck_assert_ptr_nonnull(strstr(out, "--tap-id NAME"));
	ck_assert_ptr_nonnull(strstr(out, "(default: the host name)"));
	/* a buffer too small gets a terminated prefix */
	char small[16];
	ck_assert_uint_eq(tap_conf_usage(small, sizeof small), strlen(out));
	ck_assert_uint_eq(strlen(small), sizeof small - 1);
	ck_assert_int_eq(strncmp(small, out, sizeof small - 1), 0);
	free(out);
}
END_TEST

/* Option entries of the man page: ".TP" then "\fB\-l\fR, \fB\-\-listen\fR \fIADDR:PORT\fR". */
START_TEST(man_lists_exactly_the_table)
{
	size_t len = tap_conf_man(NULL, 0, "9.9.9");
	char *out = malloc(len + 1);
	ck_assert_uint_eq(tap_conf_man(out, len + 1, "9.9.9"), len);
	ck_assert_ptr_nonnull(strstr(out, ".TH AMQPTAP 1 \"\" \"amqptap 9.9.9\""));
	ck_assert_ptr_nonnull(strstr(out, ".SH OPTIONS\n"));
	char *options = strstr(out, ".SH OPTIONS\n");
	char *end = strstr(options, ".SH SIGNALS\n");
	ck_assert_ptr_nonnull(end);
	*end = '\0';
	struct names got = {.n = 0};
	for (char *tp = strstr(options, ".TP\n"); tp; tp = strstr(tp + 1, ".TP\n")) {
		char *p = tp + 4;
		char *eol = strchr(p, '\n');
		*eol = '\0';
		/* every \fB...\fR on the line is an option name with \- for each dash */
		for (char *b = strstr(p, "\\fB"); b; b = strstr(b, "\\fB")) {
			b += 3;
			char *r = strstr(b, "\\fR");
			char name[40];
			size_t k = 0;
			for (char *q = b; q < r && k + 1 < sizeof name; q++)
				if (!(q[0] == '\\' && q[1] == '-'))
					name[k++] = *q;
			name[k] = '\0';
			names_add(&got, name, k);
			b = r;
		}
		*eol = '\n';
	}
	assert_same_names(&got, "man page");
	free(out);
}
END_TEST

/* The words bash offers after "-": compgen -W '...' of the completion. */
START_TEST(completion_lists_exactly_the_table)
{
	size_t len = tap_conf_bash_completion(NULL, 0);
	char *out = malloc(len + 1);
	ck_assert_uint_eq(tap_conf_bash_completion(out, len + 1), len);
	ck_assert_ptr_nonnull(strstr(out, "complete -F _amqptap amqptap"));
	const char *w = strstr(out, "compgen -W '-");
	ck_assert_ptr_nonnull(w);
	w += strlen("compgen -W '");
	const char *close = strchr(w, '\'');
	struct names got = {.n = 0};
	while (w < close) {
		size_t n = strcspn(w, " '");
		names_add(&got, w, n && w[n - 1] == '=' ? n - 1 : n);
		w += n;
		w += strspn(w, " ");
	}
	assert_same_names(&got, "bash completion");
	/* options that take a file complete file names */
	const char *files = strstr(out, "\tcase $prev in\n");
	ck_assert_ptr_nonnull(files);
	/* a short one also at the end of a bundle of flags (-vo FILE) */
	ck_assert_ptr_nonnull(strstr(files, "--verdicts|-?(+([qvhV]))o|--frames|-?(+([qvhV]))f|--pcap|"));
	free(out);
}
END_TEST

START_TEST(addr_format_round_trip)
{
	struct tap_conf_addr a;
	char out[300];
	ck_assert_int_eq(tap_conf_parse_addr("[fe80::1]:5672", TAP_CONF_PORT_NONZERO, &a), TAP_OK);
	tap_conf_addr_format(&a, out, sizeof out);
	ck_assert_str_eq(out, "[fe80::1]:5672");
	ck_assert_int_eq(tap_conf_parse_addr("broker.example:5671", TAP_CONF_PORT_NONZERO, &a), TAP_OK);
	tap_conf_addr_format(&a, out, sizeof out);
	ck_assert_str_eq(out, "broker.example:5671");
}
END_TEST

/* --fault: repeatable, each rule parsed at once (a bad one named in the message), off by default, proxy only. */
START_TEST(fault_rules)
{
	struct tap_conf c;
	char err[300];
	ck_assert_int_eq(PARSE(&c, err, "--upstream", "127.0.0.1:5672"), 0);
	ck_assert_uint_eq(c.n_faults, 0);
	ck_assert_int_eq(PARSE(&c, err, "--fault", "nack:every=10", "--fault=kill:after=500"), 0);
	ck_assert_uint_eq(c.n_faults, 2);
	ck_assert_str_eq(c.faults[0], "nack:every=10");
	ck_assert_str_eq(c.faults[1], "kill:after=500");
	ck_assert_int_eq(PARSE(&c, err, "--fault", "nack:every=10", "--fault", "nack:evry=3"), TAP_E_USAGE);
	ck_assert_str_eq(err, "--fault 'nack:evry=3': unknown key 'evry'");
	ck_assert_int_eq(PARSE(&c, err, "replay", "x.pcap", "--fault", "nack"), TAP_E_USAGE);
	ck_assert_ptr_nonnull(strstr(err, "--fault: only for the proxy"));
	ck_assert(!c.fault_api);
	ck_assert_int_eq(PARSE(&c, err, "--metrics", "9000", "--fault-api", "--fault-api-token", "tok"), 0);
	ck_assert(c.fault_api);
	ck_assert_str_eq(c.fault_api_token, "tok");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("conf");
	TCase *tc = tcase_create("parse");
	tcase_add_test(tc, defaults);
	tcase_add_test(tc, fault_rules);
	tcase_add_test(tc, tracker_defaults_come_from_track_h);
	tcase_add_test(tc, every_default_parses);
	tcase_add_test(tc, accepted_forms);
	tcase_add_test(tc, byte_sizes);
	tcase_add_test(tc, short_forms_and_bundles);
	tcase_add_test(tc, replay_and_double_dash);
	tcase_add_test(tc, tap_id);
	tcase_add_test(tc, outputs_not_made_yet_apart);
	tcase_add_loop_test(tc, bad_options_name_themselves, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
	tcase_add_test(tc, usage_lists_exactly_the_table);
	tcase_add_test(tc, man_lists_exactly_the_table);
	tcase_add_test(tc, completion_lists_exactly_the_table);
	tcase_add_test(tc, addr_format_round_trip);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
