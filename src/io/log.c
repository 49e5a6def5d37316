/* The tap's messages on stderr, through a TEXT output once started. See include/amqptap/log.h. */
#include "amqptap/log.h"

#include "amqptap/out.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define LINE_MAX_BYTES 1024

static struct tap_out *log_out; /* set and cleared by the main thread while no other thread logs */
static int log_level = TAP_LOG_INFO;
static uint64_t direct_lost; /* lines written directly that stderr did not take (atomic) */

void tap_log_set_level(enum tap_log_level level)
{
	__atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

bool tap_log_text(const char *text, size_t len)
{
	return tap_log_text_until(text, len, 0);
}

bool tap_log_text_until(const char *text, size_t len, int64_t deadline_us)
{
	struct tap_out *o = __atomic_load_n(&log_out, __ATOMIC_ACQUIRE);
	if (o)
		return tap_out_text_until(o, text, len, deadline_us);
	size_t n = fwrite(text, 1, len, stderr); /* unbuffered: written, or failed, at once */
	if (n < len) { /* the lines it cut and those it did not reach count lost */
		uint64_t lines = 0;
		for (size_t i = n; i < len; i++)
			lines += text[i] == '\n';
		__atomic_add_fetch(&direct_lost, lines ? lines : 1, __ATOMIC_RELAXED);
	}
	clearerr(stderr);
	return n == len;
}

static void log_v(enum tap_log_level level, const char *fmt, va_list ap)
{
	if ((int)level > __atomic_load_n(&log_level, __ATOMIC_RELAXED))
		return;
	char line[LINE_MAX_BYTES];
	static const char prefix[] = "amqptap: ";
	size_t n = sizeof prefix - 1;
	memcpy(line, prefix, n);
	int k = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
	if (k < 0)
		k = 0;
	n += (size_t)k < sizeof line - n - 1 ? (size_t)k : sizeof line - n - 2;
	line[n++] = '\n';
	tap_log_text(line, n);
}

/* The outputs' reports of themselves (tap_out_set_report), at the level they give. */
__attribute__((format(printf, 2, 0))) static void log_report(enum tap_out_report_level level, const char *fmt,
							     va_list ap)
{
	log_v(level == TAP_OUT_REPORT_ERROR ? TAP_LOG_ERROR : TAP_LOG_INFO, fmt, ap);
}

void tap_log_hear_outputs(void)
{
	(void)tap_out_set_report(log_report);
}

void tap_log_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_v(TAP_LOG_ERROR, fmt, ap);
	va_end(ap);
}

void tap_log_info(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_v(TAP_LOG_INFO, fmt, ap);
	va_end(ap);
}

void tap_log_verbose(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_v(TAP_LOG_VERBOSE, fmt, ap);
	va_end(ap);
}

static uint64_t lost_before; /* lines lost by writers already stopped */

int tap_log_start(void)
{
	struct tap_out_conf conf = {.name = "stderr", .path = "stderr", .kind = TAP_OUT_TEXT,
				    .backlog_bytes = TAP_LOG_BACKLOG_BYTES};
	struct tap_out *o = tap_out_open_fd(&conf, STDERR_FILENO);
	if (!o)
		return -1;
	__atomic_store_n(&log_out, o, __ATOMIC_RELEASE);
	return 0;
}

uint64_t tap_log_stop(int64_t deadline_us)
{
	struct tap_out *o = __atomic_exchange_n(&log_out, NULL, __ATOMIC_ACQ_REL);
	struct tap_out_stats st;
	tap_out_close(o, deadline_us, &st);
	lost_before += st.lost;
	return st.lost;
}

uint64_t tap_log_lost(void)
{
	struct tap_out *o = __atomic_load_n(&log_out, __ATOMIC_ACQUIRE);
	struct tap_out_stats st = {0};
	if (o)
		tap_out_get_stats(o, &st);
	return lost_before + st.lost + __atomic_load_n(&direct_lost, __ATOMIC_RELAXED);
}
