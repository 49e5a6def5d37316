/* amqptap audit FILE... (src/DESIGN.md §4b): the verdict files of any number of taps, sniffers and runs, in any order
 * ('-' is standard input), read together and fed, merged by their records' "ts", to the audit of the core
 * (include/amqptap/audit.h, which says what it holds). Exit 0 when every unknown was resent, 1 when one was not (or
 * memory ran out: the audit is then incomplete), 2 for a bad option or input that cannot be read. */
#include "app.h"

#include "amqptap/audit.h"
#include "amqptap/status.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AUDIT_FILES_MAX 256u

/* ---- the files, merged by ts ---- */

struct reader {
	const char *path;
	FILE *f;
	char *line;
	size_t cap;
	ssize_t len; /* the line waiting, -1: none (the file is done) */
	int64_t ts;
};

/* Room for at least one more byte and its NUL in r->line, up to TAP_AUDIT_LINE_MAX + 1 bytes of line; false when
 * the line already holds that much (or there is no memory for more). */
static bool reader_room(struct reader *r, size_t n)
{
	if (r->cap - n >= 2)
		return true;
	if (n > TAP_AUDIT_LINE_MAX)
		return false;
	size_t cap = r->cap ? r->cap * 2 : 4096;
	if (cap > TAP_AUDIT_LINE_MAX + 2)
		cap = TAP_AUDIT_LINE_MAX + 2;
	char *line = realloc(r->line, cap);
	if (!line)
		return false;
	r->line = line;
	r->cap = cap;
	return true;
}

/* The next line, without its end. Of a line longer than TAP_AUDIT_LINE_MAX only the first TAP_AUDIT_LINE_MAX + 1
 * bytes are kept (the audit skips it as too long) and the rest read past: what a file holds never decides how much
 * is read into memory. */
static void reader_next(struct reader *r)
{
	size_t n = 0;
	bool ended = false, any = false;
	while (!ended) {
		char skip[4096], *to = skip;
		size_t room = sizeof skip;
		if (reader_room(r, n)) {
			to = r->line + n;
			room = r->cap - n;
		}
		if (!fgets(to, (int)room, r->f))
			break;
		any = true;
		size_t got = strlen(to);
		ended = got && to[got - 1] == '\n';
		if (to != skip)
			n += got;
	}
	if (!any) {
		r->len = -1;
		return;
	}
	while (n && (r->line[n - 1] == '\n' || r->line[n - 1] == '\r'))
		n--;
	if (r->line)
		r->line[n] = '\0';
	r->len = (ssize_t)n;
	if (!n || !tap_audit_line_ts(r->line, n, &r->ts))
		r->ts = INT64_MIN; /* read at once: it cannot be placed */
}

static int usage(const char *msg, const char *arg)
{
	fprintf(stderr, "amqptap audit: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
	return 2;
}

int app_run_audit(int argc, char **argv)
{
	bool json = false;
	int64_t window_us = TAP_AUDIT_WINDOW_US_DEFAULT;
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
			window_us = (int64_t)ms * 1000;
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
	struct tap_audit *a = tap_audit_new(window_us);
	if (!a) {
		fprintf(stderr, "amqptap audit: out of memory\n");
		return 1;
	}
	int rc = 0;
	bool oom = false;
	for (size_t i = 0; i < n; i++)
		reader_next(&rd[i]);
	for (;;) {
		struct reader *next = NULL;
		for (size_t i = 0; i < n; i++)
			if (rd[i].len >= 0 && (!next || rd[i].ts < next->ts))
				next = &rd[i];
		if (!next)
			break;
		if (next->ts != INT64_MIN)
			tap_audit_advance(a, next->ts);
		if (next->len && tap_audit_line(a, next->line, (size_t)next->len) == TAP_E_NOMEM) {
			fprintf(stderr, "amqptap audit: %s: out of memory (a shorter --window holds less)\n", next->path);
			oom = true;
			break;
		}
		reader_next(next);
	}
	for (size_t i = 0; i < n; i++) {
		if (ferror(rd[i].f)) {
			fprintf(stderr, "amqptap audit: %s: read error\n", rd[i].path);
			rc = 2;
		}
		free(rd[i].line);
		if (rd[i].f != stdin)
			fclose(rd[i].f);
	}
	if (oom) {
		rc = 1;
	} else {
		tap_audit_finish(a);
		struct tap_buf out;
		tap_buf_init(&out);
		tap_audit_report(a, json ? TAP_AUDIT_JSON : TAP_AUDIT_TABLE, &out);
		if (out.oom) {
			fprintf(stderr, "amqptap audit: out of memory writing the report\n");
			rc = 1;
		} else if ((fwrite(out.data, 1, out.len, stdout) != out.len || fflush(stdout) != 0) && rc == 0) {
			rc = 2;
		}
		tap_buf_deinit(&out);
		if (rc == 0)
			rc = tap_audit_missing(a) ? 1 : 0;
	}
	tap_audit_free(a);
	return rc;
}
