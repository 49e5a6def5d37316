/* The reckoning of `amqptap audit` (src/DESIGN.md §4b): verdict records of any number of taps, sniffers and runs,
 * fed a line at a time in the order of their "ts" (the caller merges the files); every publish that ended unknown
 * is linked by its identity to a later attempt, or counted missing once its window has passed. Pure: no I/O (the
 * files are read by src/app_audit.c).
 *
 * Memory: one entry per identity within the window of the clock (the latest "ts" given), its message_id (at most
 * 255 bytes) while it is unresolved, a row of counts per application and exchange (at most TAP_AUDIT_GROUPS_MAX of
 * each, the rest "(other)") and the name of each open connection (at most TAP_AUDIT_CONNS_MAX). What it holds grows
 * with the publish rate times the window, never with the length of the input. jansson parses each line. */
#ifndef AMQPTAP_AUDIT_H
#define AMQPTAP_AUDIT_H

#include "amqptap/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TAP_AUDIT_WINDOW_US_DEFAULT 60000000LL /* the tap's --resend-window */
#define TAP_AUDIT_GROUPS_MAX 1000u
#define TAP_AUDIT_CONNS_MAX 1000000u
#define TAP_AUDIT_MISSING_IDS 100u             /* the ones named in the report; all are counted */
#define TAP_AUDIT_LINE_MAX (16u << 20)         /* a longer line is skipped, counted as not a record */

struct tap_audit;

/* An empty audit whose attempts are linked within window_us; NULL without memory. */
struct tap_audit *tap_audit_new(int64_t window_us);
void tap_audit_free(struct tap_audit *a);

/* The "ts" of a record line, in Unix µs: where the caller places it among the files' lines. False when it has none
 * (such a line is fed at once). */
bool tap_audit_line_ts(const char *line, size_t len, int64_t *ts_us);

/* Moves the audit's clock to ts_us (never back): identities whose window has passed are settled, the unresolved
 * ones counted missing. */
void tap_audit_advance(struct tap_audit *a, int64_t ts_us);

/* One line (a JSON record without its newline): publishes and connections are counted, other records and lines
 * that are no JSON object skipped (counted). TAP_OK, or TAP_E_NOMEM when memory ran out (the audit is then
 * incomplete and says so: the caller reports it and stops). */
int tap_audit_line(struct tap_audit *a, const char *line, size_t len);

/* Ends the input: every identity still held is settled. */
void tap_audit_finish(struct tap_audit *a);

/* Unresolved publishes counted missing so far. */
uint64_t tap_audit_missing(const struct tap_audit *a);

enum tap_audit_form {
	TAP_AUDIT_TABLE, /* per application, per exchange, the total, the first missing ones named */
	TAP_AUDIT_JSON,  /* one object, --json */
};

/* The report, appended to out (ends with a newline). */
void tap_audit_report(const struct tap_audit *a, enum tap_audit_form form, struct tap_buf *out);

#endif
