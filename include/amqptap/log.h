/* The tap's own messages on stderr. Once tap_log_start has run, lines go through an output of their own (out.h):
 * a stderr that nobody reads drops and counts lines instead of stalling the forwarding loop. Before it and after
 * tap_log_stop they are written directly. Every line starts with "amqptap: ". Any thread may log. */
#ifndef AMQPTAP_LOG_H
#define AMQPTAP_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What is written: errors always, info by default, verbose on request. */
enum tap_log_level {
	TAP_LOG_ERROR,
	TAP_LOG_INFO,
	TAP_LOG_VERBOSE,
};

#define TAP_LOG_BACKLOG_BYTES (256 * 1024)

void tap_log_set_level(enum tap_log_level level);
/* Outputs (out.h) report their own failures through the log from now on (tap_out_set_report): call it before the
 * first output opens, so a report reaches stderr before tap_log_start as after it. */
void tap_log_hear_outputs(void);

void tap_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tap_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void tap_log_verbose(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Whole lines as they are (the summary), whatever the level: the caller asked for them. Returns false when they
 * were lost (counted in tap_log_lost). */
bool tap_log_text(const char *text, size_t len);
/* tap_log_text waiting until deadline_us for the log's reserve or for room in its backlog (tap_out_text_until). */
bool tap_log_text_until(const char *text, size_t len, int64_t deadline_us);

/* Starts the writer thread for stderr; 0, or -1 with errno set (messages then stay direct: a running tap must not
 * go on without it). */
int tap_log_start(void);
/* Lets the writer finish until deadline_us (tap_out_clock_us) and goes back to direct writes. Returns how many
 * lines were lost while it ran. */
uint64_t tap_log_stop(int64_t deadline_us);
/* Lines lost so far. */
uint64_t tap_log_lost(void);

#endif
