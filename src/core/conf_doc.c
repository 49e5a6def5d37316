/* The option table rendered for people and shells: --help, the amqptap(1) man page (roff, man(7) macros) and
 * the bash completion. The build generates the man page and the completion with tap_gendoc, so all three
 * list exactly the options the parser takes. Pure text into a caller's buffer, snprintf-style. */
#include "amqptap/conf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Text written so far; past cap it is only counted. */
struct doc {
	char *out;
	size_t cap;
	size_t len;
};

static void doc_put(struct doc *d, const char *s, size_t n)
{
	if (d->len + 1 < d->cap) {
		size_t room = d->cap - 1 - d->len;
		memcpy(d->out + d->len, s, n < room ? n : room);
	}
	d->len += n;
}

static void doc_puts(struct doc *d, const char *s)
{
	doc_put(d, s, strlen(s));
}

static void doc_printf(struct doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void doc_printf(struct doc *d, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n > 0)
		doc_put(d, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static size_t doc_end(struct doc *d)
{
	if (d->cap > 0)
		d->out[d->len < d->cap ? d->len : d->cap - 1] = '\0';
	return d->len;
}

/* The forms of the command, shared by --help, the man page's SYNOPSIS and the completion. */
static const struct {
	const char *subcommand; /* NULL: the proxy */
	const char *operand;    /* NULL: none */
	const char *what;
} forms[] = {
	{NULL, NULL, "transparent AMQP 0-9-1 wire-tap proxy"},
	{"replay", "CAPTURE", "the same records from a pcap/pcapng capture (- for standard input)"},
	{"sniff", NULL, "the same records from packets captured live (libpcap, --interface)"},
	{"route", NULL, "where a publish goes by the broker's definitions (amqptap route --help)"},
	{"audit", "FILE...", "resends and duplicates across verdict files (amqptap audit --help)"},
};

#define N_FORMS (sizeof forms / sizeof forms[0])

/* What --help prints after "default": NULL when the table gives no default. */
static const char *default_text(const struct tap_conf_option *o, char *tmp, size_t cap)
{
	if (o->def_shown)
		return o->def_shown;
	if (o->def)
		return o->def;
	if (o->kind == TAP_OPT_U32 || o->kind == TAP_OPT_PORTS) {
		snprintf(tmp, cap, "%u", o->def_u32);
		return tmp;
	}
	return NULL;
}

/* --help's layout: the option at the left, its help from this column on, lines broken before HELP_WIDTH. */
#define HELP_INDENT 31
#define HELP_WIDTH 100

/* Puts one unbreakable piece of help text, starting a new line first when it would not fit. */
static void help_word(struct doc *d, size_t *col, const char *word, size_t len)
{
	if (*col > HELP_INDENT && *col + 1 + len > HELP_WIDTH) {
		doc_printf(d, "\n%*s", HELP_INDENT, "");
		*col = HELP_INDENT;
	} else if (*col > HELP_INDENT) {
		doc_puts(d, " ");
		(*col)++;
	}
	doc_put(d, word, len);
	*col += len;
}

size_t tap_conf_usage(char *out, size_t cap)
{
	struct doc d = {out, cap, 0};
	size_t n;
	const struct tap_conf_option *opts = tap_conf_options(&n);
	for (size_t i = 0; i < N_FORMS; i++) {
		char left[64];
		snprintf(left, sizeof left, "amqptap %s%s%s%s[options]", forms[i].subcommand ? forms[i].subcommand : "",
			 forms[i].subcommand ? " " : "", forms[i].operand ? forms[i].operand : "",
			 forms[i].operand ? " " : "");
		doc_printf(&d, "%s%-38s %s\n", i == 0 ? "usage: " : "       ", left, forms[i].what);
	}
	doc_puts(&d, "       amqptap --help | --version\n\noptions:\n");
	for (size_t i = 0; i < n; i++) {
		const struct tap_conf_option *o = &opts[i];
		char left[64], shortpart[8] = "", num[16];
		if (o->short_name)
			snprintf(shortpart, sizeof shortpart, "-%c, ", o->short_name);
		snprintf(left, sizeof left, "%s--%s%s%s", shortpart, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
		doc_printf(&d, "  %-*s", HELP_INDENT - 2, left);
		size_t col = strlen(left) + 2 < HELP_INDENT ? HELP_INDENT : strlen(left) + 2;
		for (const char *w = o->help; *w;) {
			size_t len = strcspn(w, " ");
			help_word(&d, &col, w, len);
			w += len + strspn(w + len, " ");
		}
		const char *def = default_text(o, num, sizeof num);
		if (def) {
			char phrase[128];
			snprintf(phrase, sizeof phrase, "(default: %s)", def);
			help_word(&d, &col, phrase, strlen(phrase));
		}
		doc_puts(&d, "\n");
	}
	return doc_end(&d);
}

/* Text for a roff line: hyphens as \-, backslashes as \e, and a leading . or ' cannot start a request. */
static void roff_text(struct doc *d, const char *s)
{
	if (*s == '.' || *s == '\'')
		doc_puts(d, "\\&");
	for (; *s; s++) {
		if (*s == '-')
			doc_puts(d, "\\-");
		else if (*s == '\\')
			doc_puts(d, "\\e");
		else
			doc_put(d, s, 1);
	}
}

/* Prose of the man page; roff source, hyphens already escaped. */
static const char man_description[] =
	".SH DESCRIPTION\n"
	"Publishers connect to \\fBamqptap\\fR instead of RabbitMQ. It forwards every byte unchanged in both\n"
	"directions, decodes a copy of the stream, and writes one JSON record per \\fBbasic.publish\\fR with what the\n"
	"broker did with it: routed, returned (312 NO_ROUTE), acked, nacked, or left without an answer when the\n"
	"channel or connection died, with latencies, and whether the broker sent its Basic.Return before its\n"
	"Basic.Ack. Decoding never delays forwarding: if the decoder is confused, traffic still flows.\n"
	".PP\n"
	"Records are JSON Lines on \\fB\\-\\-verdicts\\fR: one \\fBpublish\\fR record per publish (fields\n"
	"\\fBroute\\fR, \\fBconfirm\\fR, \\fBorder\\fR, \\fBreturn_us\\fR, \\fBconfirm_us\\fR, \\fBreason\\fR),\n"
	"and \\fBconnection\\fR,\n"
	"\\fBchannel\\fR, \\fBblocked\\fR, \\fBunblocked\\fR, \\fBdecode_error\\fR, \\fBwarning\\fR and\n"
	"\\fBrecords_lost\\fR records (and, from a capture, \\fBcapture_gap\\fR and \\fBcapture_drops\\fR).\n"
	"Credentials are never written to any output.\n"
	".PP\n"
	"\\fBamqptap replay\\fR reads a pcapng or pcap capture (its own \\fB\\-\\-pcap\\fR output or tcpdump's; \\fB\\-\\fR:\n"
	"standard input, as it arrives) and writes the same records, with latencies taken from the capture's\n"
	"timestamps. \\fBamqptap sniff\\fR captures an interface live (libpcap, CAP_NET_RAW) with no publisher\n"
	"touched, and writes the same records as packets arrive.\n";

static const char man_tail[] =
	".SH SIGNALS\n"
	".TP\n"
	".BR SIGINT \", \" SIGTERM\n"
	"Stop accepting, let live sessions finish for \\fB\\-\\-grace\\fR milliseconds, then close them, write every\n"
	"pending verdict, flush the files and exit (0, or 1 when records were lost). A second signal closes at once.\n"
	".TP\n"
	".B SIGHUP\n"
	"Reopen the \\fB\\-\\-verdicts\\fR, \\fB\\-\\-frames\\fR and \\fB\\-\\-pcap\\fR files (for logrotate;\n"
	"a new capture file starts with its own header). TLS certificates and keys are not reloaded: a new one\n"
	"takes a restart.\n"
	".TP\n"
	".B SIGUSR1\n"
	"Write connection counters and a summary of the verdicts so far to standard error; with TLS, also how\n"
	"many TLS legs keep their record buffers (busy in the last second).\n"
	".SH EXIT STATUS\n"
	".TP\n"
	".B 0\n"
	"Clean shutdown, or \\fB\\-\\-help\\fR and \\fB\\-\\-version\\fR.\n"
	".TP\n"
	".B 1\n"
	"Runtime failure (for example the listening address is taken, or the name server did not answer for the\n"
	"\\fB\\-\\-upstream\\fR name), or records were lost (an output that could not keep up or be written, a\n"
	"connection the tap had no memory to follow).\n"
	".TP\n"
	".B 2\n"
	"Usage or configuration error: one line on standard error names the option.\n"
	".SH ENVIRONMENT\n"
	".TP\n"
	".B SSLKEYLOGFILE\n"
	"Where to write the TLS key log when \\fB\\-\\-keylog\\fR is not given.\n"
	".SH FILES\n"
	"With the Debian package:\n"
	".TP\n"
	".I /etc/default/amqptap\n"
	"\\fBAMQPTAP_OPTS\\fR, the options of \\fBamqptap.service\\fR.\n"
	".TP\n"
	".I /var/log/amqptap/verdicts.jsonl\n"
	"The records of \\fBamqptap.service\\fR, rotated by \\fI/etc/logrotate.d/amqptap\\fR with SIGHUP.\n"
	".SH EXAMPLES\n"
	"Tap the broker on 10.0.0.5 for clients on this host, records to a file:\n"
	".PP\n"
	".nf\n"
	".RS\n"
	"amqptap \\-\\-upstream 10.0.0.5:5672 \\-\\-listen 127.0.0.1:5673 \\-\\-verdicts verdicts.jsonl\n"
	".RE\n"
	".fi\n"
	".PP\n"
	"Publishes the broker answered with neither a route nor an ack:\n"
	".PP\n"
	".nf\n"
	".RS\n"
	"jq \\-c 'select(.type == \"publish\" and (.route != \"routed\" or .confirm != \"ack\"))' verdicts.jsonl\n"
	".RE\n"
	".fi\n"
	".PP\n"
	"The same records from a capture whose broker listened on port 5671:\n"
	".PP\n"
	".nf\n"
	".RS\n"
	"amqptap replay broker.pcapng \\-\\-port 5671\n"
	".RE\n"
	".fi\n"
	".SH SEE ALSO\n"
	".BR jq (1),\n"
	".BR logrotate (8),\n"
	".BR systemd.exec (5),\n"
	".BR tshark (1)\n";

size_t tap_conf_man(char *out, size_t cap, const char *version)
{
	struct doc d = {out, cap, 0};
	size_t n;
	const struct tap_conf_option *opts = tap_conf_options(&n);
	doc_puts(&d, ".\\\" Generated from the option table of amqptap (src/core/conf.c) at build time;"
		     " do not edit.\n");
	doc_puts(&d, ".TH AMQPTAP 1 \"\" \"amqptap ");
	roff_text(&d, version);
	doc_puts(&d, "\" \"User Commands\"\n.nh\n.SH NAME\n"
		     "amqptap \\- transparent AMQP 0\\-9\\-1 wire\\-tap proxy that "
		     "writes the broker's verdict on every publish\n.SH SYNOPSIS\n");
	for (size_t i = 0; i < N_FORMS; i++) {
		doc_puts(&d, ".B amqptap");
		if (forms[i].subcommand) {
			doc_puts(&d, " ");
			roff_text(&d, forms[i].subcommand);
		}
		if (forms[i].operand) {
			doc_puts(&d, "\n.I ");
			roff_text(&d, forms[i].operand);
		}
		doc_puts(&d, "\n.RI [ options ]\n.br\n");
	}
	doc_puts(&d, ".B amqptap\n.BR \\-\\-help \" | \" \\-\\-version\n");
	doc_puts(&d, man_description);
	doc_puts(&d, ".SH OPTIONS\nLong options take their value as \\fB\\-\\-opt\\fR \\fIVALUE\\fR or "
		     "\\fB\\-\\-opt\\fR=\\fIVALUE\\fR and must be spelled out in full; short flags may be bundled "
		     "(\\fB\\-vq\\fR); \\fB\\-\\-\\fR ends the options. A later option overrides an earlier one.\n");
	for (size_t i = 0; i < n; i++) {
		const struct tap_conf_option *o = &opts[i];
		char num[16];
		doc_puts(&d, ".TP\n");
		if (o->short_name)
			doc_printf(&d, "\\fB\\-%c\\fR, ", o->short_name);
		doc_puts(&d, "\\fB\\-\\-");
		roff_text(&d, o->name);
		doc_puts(&d, "\\fR");
		if (o->arg) {
			doc_puts(&d, " \\fI");
			roff_text(&d, o->arg);
			doc_puts(&d, "\\fR");
		}
		doc_puts(&d, "\n");
		roff_text(&d, o->help);
		doc_puts(&d, ".");
		const char *def = default_text(o, num, sizeof num);
		if (def) {
			doc_puts(&d, " Default: ");
			roff_text(&d, def);
			doc_puts(&d, ".");
		}
		doc_puts(&d, "\n");
	}
	doc_puts(&d, man_tail);
	return doc_end(&d);
}

/* A case pattern for short option c, which takes a value: alone (-o) or ending a bundle of the flags without one
 * (-vo FILE), with bash-completion's extglob. */
static void short_with_value(struct doc *d, const char *flags, char c)
{
	if (flags[0])
		doc_printf(d, "|-?(+([%s]))%c", flags, c);
	else
		doc_printf(d, "|-%c", c);
}

/* Words for bash: every option's long form (with a trailing '=' for those that take a value, as bash-completion
 * does) and short form; the value completion follows the option's kind. */
size_t tap_conf_bash_completion(char *out, size_t cap)
{
	struct doc d = {out, cap, 0};
	size_t n;
	const struct tap_conf_option *opts = tap_conf_options(&n);
	doc_puts(&d, "# bash completion for amqptap(1). Generated from the option table of amqptap (src/core/conf.c)\n"
		     "# at build time; do not edit.\n\n"
		     "_amqptap()\n{\n\tlocal cur prev words cword split\n\t_init_completion -s || return\n\n");
	/* after an option that takes a value: a file name for files, an interface for interfaces, nothing to offer
	 * for the rest */
	static const struct {
		int kind; /* -1: every other option with a value */
		const char *complete;
	} groups[] = {{TAP_OPT_PATH, "_filedir\n\t\t"}, {TAP_OPT_IFACE, "_available_interfaces -a\n\t\t"}, {-1, ""}};
	char flags[32] = ""; /* the short options without a value */
	size_t n_flags = 0;
	for (size_t i = 0; i < n && n_flags + 1 < sizeof flags; i++)
		if (opts[i].short_name && !opts[i].arg)
			flags[n_flags++] = opts[i].short_name;
	doc_puts(&d, "\tcase $prev in\n");
	for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
		bool any = false;
		for (size_t i = 0; i < n; i++) {
			const struct tap_conf_option *o = &opts[i];
			bool other = o->kind != TAP_OPT_PATH && o->kind != TAP_OPT_IFACE;
			if (!o->arg || (groups[g].kind < 0 ? !other : (int)o->kind != groups[g].kind))
				continue;
			doc_printf(&d, "%s--%s", any ? "|" : "\t", o->name);
			if (o->short_name)
				short_with_value(&d, flags, o->short_name);
			any = true;
		}
		if (any)
			doc_printf(&d, ")\n\t\t%sreturn\n\t\t;;\n", groups[g].complete);
	}
	doc_puts(&d, "\tesac\n\t$split && return\n\n");
	doc_puts(&d, "\tif [[ $cur == -* ]]; then\n\t\tCOMPREPLY=($(compgen -W '");
	for (size_t i = 0; i < n; i++) {
		const struct tap_conf_option *o = &opts[i];
		doc_printf(&d, "%s--%s%s", i ? " " : "", o->name, o->arg ? "=" : "");
		if (o->short_name)
			doc_printf(&d, " -%c", o->short_name);
	}
	doc_puts(&d, "' -- \"$cur\"))\n\t\t[[ ${COMPREPLY-} == *= ]] && compopt -o nospace\n\t\treturn\n\tfi\n\n");
	/* the first word that is not an option may be a subcommand; replay's next one is the capture, audit's files */
	doc_puts(&d, "\tlocal i first=\n\tfor ((i = 1; i < cword; i++)); do\n\t\tcase ${words[i - 1]} in\n\t\t");
	bool any = false;
	for (size_t i = 0; i < n; i++) {
		const struct tap_conf_option *o = &opts[i];
		if (!o->arg)
			continue;
		doc_printf(&d, "%s--%s", any ? "|" : "", o->name);
		if (o->short_name)
			short_with_value(&d, flags, o->short_name);
		any = true;
	}
	doc_puts(&d, ")\n\t\t\tcontinue\n\t\t\t;;\n\t\tesac\n\t\tif [[ ${words[i]} != -* ]]; then\n"
		     "\t\t\tfirst=${words[i]}\n\t\t\tbreak\n\t\tfi\n\tdone\n"
		     "\tif [[ -z $first ]]; then\n\t\tCOMPREPLY=($(compgen -W '");
	bool first_sub = true;
	for (size_t i = 0; i < N_FORMS; i++) {
		if (!forms[i].subcommand)
			continue;
		doc_printf(&d, "%s%s", first_sub ? "" : " ", forms[i].subcommand);
		first_sub = false;
	}
	doc_puts(&d, "' -- \"$cur\"))\n\telif [[ $first == replay || $first == audit ]]; then\n\t\t_filedir\n\tfi\n} &&\n"
		     "\tcomplete -F _amqptap amqptap\n");
	return doc_end(&d);
}
