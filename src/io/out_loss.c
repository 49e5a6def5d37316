/* What an output lost and why (see out_int.h): the counts by cause (enum tap_out_loss), the first report of each
 * cause, and the loss note that marks a gap: a records_lost record (LINES) or a line of text (TEXT). */
#include "out_int.h"

#include "amqptap/json.h"
#include "amqptap/record.h"

#include <inttypes.h>
#include <string.h>

void out_loss_note(struct tap_buf *b, const struct tap_out *o, uint64_t lost, int64_t first_us,
		   enum tap_out_loss cause, int err)
{
	tap_buf_reset(b);
	if (o->kind == TAP_OUT_TEXT) {
		tap_buf_printf(b, "amqptap: %" PRIu64 " line(s) of this log were lost (%s)\n", lost,
			       err                                ? strerror(err)
			       : cause == TAP_OUT_LOST_NO_MEMORY ? "no memory"
								  : "written faster than it was read");
		return;
	}
	struct tap_json j;
	tap_record_begin_once(&j, b, "records_lost", out_wall_us(), o->run); /* run: whose loss, in merged records */
	if (o->tap_id)
		tap_json_kv_str(&j, "tap", o->tap_id);
	tap_json_kv_str(&j, "output", o->name);
	tap_json_kv_uint(&j, "lost", lost);
	tap_json_kv_ts(&j, "first_lost_ts", first_us);
	tap_json_kv_str(&j, "reason", tap_out_loss_name(cause));
	if (err)
		tap_json_kv_str(&j, "error", strerror(err));
	tap_json_obj_end(&j);
	tap_buf_putc(b, '\n');
}

void out_note_drop(struct tap_out *o, uint64_t records, enum tap_out_loss cause)
{
	if (records == 0)
		return;
	o->lost_by[cause] += records;
	if (o->drop_unreported == 0) {
		o->drop_first_us = out_wall_us();
		o->drop_cause = TAP_OUT_LOST_BACKLOG_FULL;
	}
	o->drop_unreported += records;
	if (cause == TAP_OUT_LOST_NO_MEMORY)
		o->drop_cause = TAP_OUT_LOST_NO_MEMORY; /* the note names the want of memory when some were for it */
	if (o->drop_reported[cause] || o->kind == TAP_OUT_TEXT)
		return;
	o->drop_reported[cause] = true;
	if (cause == TAP_OUT_LOST_NO_MEMORY)
		out_report(TAP_OUT_REPORT_ERROR, "--%s %s: no memory for records; they are dropped and counted",
			   o->name, o->path ? o->path : "-");
	else
		out_report(TAP_OUT_REPORT_ERROR,
			   "--%s %s: written slower than records come (%zu KiB backlog full); records are dropped "
			   "and counted",
			   o->name, o->path ? o->path : "-", o->backlog_bytes / 1024);
}

void out_writer_lost(struct tap_out *o, uint64_t lost, int err)
{
	pthread_mutex_lock(&o->mu);
	o->lost_by[TAP_OUT_LOST_WRITE_FAILED] += lost;
	o->write_errors++;
	pthread_mutex_unlock(&o->mu);
	if (o->wlost_unreported == 0)
		o->wfirst_us = out_wall_us();
	o->wlost_unreported += lost;
	o->werr = err;
	if (!o->fail_reported && o->kind != TAP_OUT_TEXT) {
		o->fail_reported = true;
		out_report(TAP_OUT_REPORT_ERROR,
			   "--%s %s: write failed: %s; records are dropped and counted until writing works again",
			   o->name, o->path ? o->path : "-", strerror(err));
	}
}

void out_stats_locked(const struct tap_out *o, struct tap_out_stats *st)
{
	st->records = o->records;
	st->lost = 0;
	for (int i = 0; i < TAP_OUT_N_LOSSES; i++) {
		st->lost_by[i] = o->lost_by[i];
		st->lost += o->lost_by[i];
	}
	st->write_errors = o->write_errors;
}

uint64_t out_unwritten_records(const struct tap_out *o, size_t current_off)
{
	uint64_t n = 0;
	const struct chunk *c = o->current;
	if (c && c->kind == CHUNK_DATA) {
		if (o->kind == TAP_OUT_BLOCKS) {
			for (size_t i = 0; i < c->records; i++)
				n += c->ends[i] > current_off;
		} else {
			n = out_count_newlines(c->data.data + current_off, c->data.len - current_off);
			if (n > c->records) /* a loss note chunk holds no record */
				n = c->records;
		}
	}
	for (c = o->head; c; c = c->next)
		n += c->kind == CHUNK_DATA ? c->records : 0;
	return n;
}
