/* The outputs every mode writes (--verdicts, --frames, --pcap), the tracker and the observer that feed them, and
 * what is said of them: the summary, the losses, the kernel's drops in sniff mode. */
#include "app.h"

#include "amqptap/files.h"
#include "amqptap/mgmt.h"
#include "amqptap/route.h"
#include "amqptap/route_defs.h"

#include "amqptap/buf.h"
#include "amqptap/json.h"
#include "amqptap/log.h"
#include "amqptap/record.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const out_names[OUT_COUNT] = {"verdicts", "frames", "pcap"};

/* Room for every reason of tap_out_loss with a 20-digit count. */
#define LOSS_REASONS_MAX 160

/* This process's run id: 12 hex digits, 48 random bits, so (run, conn) names one connection whatever
 * the tap or restart, at 21 bytes per record ("run" on every record, the tap id only on connection open). */
static void make_run_id(char out[TAP_TRACK_RUN_MAX + 1], int64_t now_us)
{
	uint8_t r[6];
	if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
		uint64_t x = (uint64_t)now_us ^ ((uint64_t)getpid() << 40); /* no entropy yet: time and pid */
		for (size_t i = 0; i < sizeof r; i++)
			r[i] = (uint8_t)(x >> (8 * i));
	}
	for (size_t i = 0; i < sizeof r; i++)
		(void)snprintf(out + 2 * i, 3, "%02x", r[i]);
}

static void emit_record(void *ctx, const char *json, size_t len)
{
	struct app *app = ctx;
	tap_out_line(app->out[OUT_VERDICTS], json, len);
}

static void frame_line(void *ctx, const char *json, size_t len)
{
	struct app *app = ctx;
	tap_out_line(app->out[OUT_FRAMES], json, len);
}

static void pcap_block(void *ctx, const void *block, size_t len)
{
	struct app *app = ctx;
	tap_out_block(app->out[OUT_PCAP], block, len);
}

void app_outputs_flush(struct app *app)
{
	for (size_t i = 0; i < OUT_COUNT; i++)
		if (app->out[i])
			tap_out_flush(app->out[i]);
}

static bool output_wanted(const struct app *app, enum app_out i)
{
	return i == OUT_VERDICTS || (i == OUT_FRAMES && app->conf->frames) || (i == OUT_PCAP && app->conf->pcap);
}

/* "backlog_full=3 write_failed=2": the reasons an output lost records for, or "". */
static void loss_reasons(const struct tap_out_stats *st, char out[LOSS_REASONS_MAX])
{
	size_t len = 0;
	out[0] = '\0';
	for (int r = 0; r < TAP_OUT_N_LOSSES && len < LOSS_REASONS_MAX; r++) {
		if (!st->lost_by[r])
			continue;
		int w = snprintf(out + len, LOSS_REASONS_MAX - len, "%s%s=%" PRIu64, len ? " " : "",
				 tap_out_loss_name((enum tap_out_loss)r), st->lost_by[r]);
		len += w > 0 ? (size_t)w : 0;
	}
}

/* The process's peak resident memory in KiB (VmHWM), or 0 where /proc does not say. */
static unsigned long peak_rss_kib(void)
{
	unsigned long kib = 0;
	char line[128];
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmHWM: %lu kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}


/* The tracker's summary, then one line per output: what it was handed and what it lost, and why; last the
 * process's peak memory (what every source of it came to: sessions, queues, tracking, backlogs). */
void app_print_summary(struct app *app, int64_t wait_until_us)
{
	struct tap_buf b;
	tap_buf_init(&b);
	if (app->track)
		tap_track_summary(app->track, &b);
	for (size_t i = 0; i < OUT_COUNT; i++) {
		struct tap_out_stats st = {0};
		if (!output_wanted(app, (enum app_out)i))
			continue;
		if (app->outputs_closed)
			st = app->out_final[i];
		else if (app->out[i])
			tap_out_get_stats(app->out[i], &st);
		char why[LOSS_REASONS_MAX];
		loss_reasons(&st, why);
		tap_buf_printf(&b, "output %s records=%" PRIu64 " lost=%" PRIu64 " write_errors=%" PRIu64 "%s%s\n",
			       out_names[i], st.records, st.lost, st.write_errors, *why ? " " : "", why);
	}
	uint64_t log_lost = tap_log_lost();
	if (log_lost)
		tap_buf_printf(&b, "output stderr lost=%" PRIu64 " lines\n", log_lost);
	if (app->observer.pending_over) /* counted in "short of memory" too */
		tap_buf_printf(&b, "decoder contents_without_details=%" PRIu64 " (in-progress contents over %u MiB)\n",
			       app->observer.pending_over, (unsigned)(app->observer.pending_max >> 20));
	tap_buf_printf(&b, "process peak_rss_kib=%lu\n", peak_rss_kib());
	bool written = !b.oom && (b.len == 0 || tap_log_text_until(b.data, b.len, wait_until_us));
	if (!written && app->track) { /* what matters most, on the stack */
		struct tap_track_stats ts;
		tap_track_get_stats(app->track, &ts);
		tap_log_error("summary: no memory or no room in the log to write it in full; %" PRIu64 " publishes, %" PRIu64
		              " records not rendered, %" PRIu64 " connections not followed (the outputs' losses, if any, follow)",
		              ts.publishes, ts.records_oom, ts.conns_unfollowed);
	}
	tap_buf_deinit(&b);
}

/* --pcap too: its writer begins the new file with the pcapng head (the connections still open go on in it
 * without their handshake, as in a capture started while they ran) */
void app_outputs_reopen(struct app *app)
{
	for (size_t i = 0; i < OUT_COUNT; i++)
		if (app->out[i])
			tap_out_reopen(app->out[i]);
}

static void *pcap_open(void *ctx, uint64_t conn, const char *client, const char *server, int64_t ts_us)
{
	struct app *app = ctx;
	(void)conn;
	struct tap_pcapng_conn *c = tap_pcapng_conn_open(app->pcap, client, server, ts_us);
	/* its handshake now, in the order of the accepts, so a replay numbers the connections as the tap did; with a
	 * broker name of several addresses not before the connection's first packet, which is when the address it
	 * goes to is settled (tap_conn_upstream) */
	if (!app->upstream_movable)
		tap_pcapng_conn_begin(c);
	return c;
}

static void pcap_server(void *ctx, void *sc, const char *server)
{
	(void)ctx;
	tap_pcapng_conn_server(sc, server);
}

static void pcap_data(void *ctx, void *sc, enum tap_dir dir, const uint8_t *data, size_t len, int64_t ts_us)
{
	(void)ctx;
	tap_pcapng_conn_data(sc, dir, data, len, ts_us);
}

static void pcap_close(void *ctx, void *sc, const char *how, int64_t ts_us)
{
	(void)ctx;
	tap_pcapng_conn_close(sc, tap_pcapng_end_of(how), ts_us);
}

/* A file that existed keeps its mode (a chmod 640 for a shipper is the operator's): one every user may read is
 * said once, for the outputs that can hold what publishers send (--frames: header values and body bytes when
 * asked; --pcap: every message whole). */
static void warn_if_world_readable(enum app_out i, const char *path)
{
	struct stat st;
	if (i == OUT_VERDICTS || !path || strcmp(path, "-") == 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
	    !(st.st_mode & S_IROTH))
		return;
	fprintf(stderr, "amqptap: WARNING: --%s %s is readable by every user (mode %04o) and holds what publishers "
		"send%s: chmod o-r it\n", out_names[i], path, (unsigned)(st.st_mode & 07777),
		i == OUT_PCAP ? " (whole messages)" : "");
}

/* Opens output i into app->out[i]: 0, or the exit code after saying why (2: the path cannot be opened, a bad
 * value; 1: the tap had no memory or thread for it). A BLOCKS output is --pcap: each of its files begins with
 * the pcapng head. */
static int open_output(struct app *app, enum app_out i, const char *path, enum tap_out_kind kind)
{
	struct tap_out_conf oc = {.name = out_names[i], .path = path, .kind = kind};
	if (app->run[0]) { /* records_lost records carry the identity every other record does */
		oc.run = app->run;
		oc.tap_id = app->conf->tap_id;
	}
	struct tap_buf head;
	tap_buf_init(&head);
	if (kind == TAP_OUT_BLOCKS && !tap_pcapng_head(&head)) {
		tap_buf_deinit(&head);
		fprintf(stderr, "amqptap: out of memory at start\n");
		return 1;
	}
	oc.head = head.data;
	oc.head_len = head.len;
	app->out[i] = tap_out_open(&oc);
	tap_buf_deinit(&head);
	if (app->out[i]) {
		warn_if_world_readable(i, path);
		return 0;
	}
	int err = errno;
	bool no_memory = err == ENOMEM || err == EAGAIN; /* EAGAIN: no memory or thread for the writer */
	fprintf(stderr, "amqptap: --%s %s: %s%s\n", out_names[i], path ? path : "-",
	        err == EAGAIN ? "cannot start its writer thread: " : "", strerror(err));
	return no_memory ? 1 : 2;
}

int app_outputs_open(struct app *app)
{
	const struct tap_conf *conf = app->conf;
	if (conf->mode != TAP_MODE_REPLAY) { /* replay leaves identity out: its records stay deterministic */
		app->started_us = tap_now_us();
		make_run_id(app->run, app->started_us);
	}
	int rc = open_output(app, OUT_VERDICTS, conf->verdicts, TAP_OUT_LINES);
	if (rc)
		return rc;
	if (conf->frames) {
		if ((rc = open_output(app, OUT_FRAMES, conf->frames, TAP_OUT_LINES)))
			return rc;
		app->frames_sink = (struct tap_frames_sink){app, frame_line};
	}
	if (conf->pcap) {
		if ((rc = open_output(app, OUT_PCAP, conf->pcap, TAP_OUT_BLOCKS)))
			return rc;
		app->pcap = tap_pcapng_new_headless(pcap_block, app); /* the output writes the head */
		if (!app->pcap) {
			fprintf(stderr, "amqptap: out of memory at start\n");
			return 1;
		}
		app->pcap_sink = (struct tap_capture_sink){app, pcap_open, pcap_data, pcap_close, pcap_server};
	}
	struct tap_track_conf tconf = {
		.return_window_us = (int64_t)conf->return_window_ms * 1000,
		.late_return_us = (int64_t)conf->late_return_ms * 1000,
		.stall_after_us = (int64_t)conf->stall_after_s * 1000000,
		.consumer_timeout_us = (int64_t)conf->consumer_timeout_ms * 1000,
		.max_outstanding = conf->max_outstanding,
		.max_memory = conf->max_tracking_memory,
		.header_values = conf->header_values,
		.topology_interval_us = (int64_t)conf->topology_interval_s * 1000000,
		.identity_mode = (unsigned)tap_conf_identity_mode(conf), /* checked by the parser */
		.resend_window_us = (int64_t)conf->resend_window_ms * 1000,
	};
	if (app->run[0]) {
		tconf.started_us = app->started_us;
		tconf.run = app->run;
		tconf.tap_id = conf->tap_id;
	}
	app->track = tap_track_new(&tconf, emit_record, app);
	app->min_window_us = tconf.late_return_us < tconf.return_window_us ? tconf.late_return_us : tconf.return_window_us;
	if (!app->track) {
		fprintf(stderr, "amqptap: out of memory at start\n");
		return 1;
	}
	if ((rc = app_topology_load(app)))
		return rc;
	tap_observer_init(&app->observer, app->track, emit_record, app, app->out[OUT_FRAMES] ? &app->frames_sink : NULL,
			  conf->body_bytes);
	if (app->pcap)
		app->observer.capture = &app->pcap_sink;
	app->outputs_ready = true;
	return 0;
}

int64_t app_outputs_stop_deadline(void)
{
	return tap_out_clock_us() + (int64_t)TAP_OUT_FLUSH_MS * 1000;
}

void app_outputs_drain_until(struct app *app, int64_t deadline_us)
{
	for (size_t i = 0; i < OUT_COUNT; i++)
		if (app->out[i])
			tap_out_wait_until(app->out[i], deadline_us);
}

bool app_outputs_close(struct app *app, int64_t deadline_us, enum app_end end)
{
	tap_pcapng_free(app->pcap); /* writes nothing more */
	app->pcap = NULL;
	for (size_t i = 0; i < OUT_COUNT; i++) {
		tap_out_close(app->out[i], deadline_us, &app->out_final[i]);
		app->out[i] = NULL;
	}
	app->outputs_closed = true;
	bool whole = true;
	if (app->outputs_ready) {
		/* SIGUSR1 asks for it even with -q */
		if (end == APP_END_RAN && app->conf->verbosity >= TAP_VERBOSITY_NORMAL)
			app_print_summary(app, tap_out_clock_us() + LOG_FLUSH_MS * 1000);
		tap_observer_deinit(&app->observer);
	}
	for (size_t i = 0; i < OUT_COUNT; i++) {
		const struct tap_out_stats *st = &app->out_final[i];
		if (st->lost == 0)
			continue;
		whole = false;
		char why[LOSS_REASONS_MAX];
		loss_reasons(st, why);
		tap_log_error("--%s: %" PRIu64 " of %" PRIu64 " records lost (%s)", out_names[i], st->lost, st->records,
			      why);
	}
	if (app->track) {
		struct tap_track_stats ts;
		tap_track_get_stats(app->track, &ts);
		if (ts.records_oom) {
			whole = false;
			tap_log_error("%" PRIu64 " records lost: no memory to render them", ts.records_oom);
		}
		if (ts.conns_unfollowed) {
			whole = false;
			tap_log_error("%" PRIu64 " connections have no records: no memory to follow them",
			              ts.conns_unfollowed);
		}
	}
	tap_track_free(app->track);
	app->track = NULL;
	tap_mgmt_free(app->mgmt);
	app->mgmt = NULL;
	tap_route_model_free(app->topology); /* after the tracker that judged by it */
	app->topology = NULL;
	return whole;
}

/* --- --definitions (issue 36) ----------------------------------------------------------------------------------- */

static struct tap_route_model *topology_read(const char *path, char *err, size_t cap)
{
	struct tap_route_defs_limits lim;
	tap_route_defs_limits_default(&lim);
	char *data;
	size_t len;
	if (tap_files_read(path, lim.max_input, &data, &len, err, cap))
		return NULL;
	struct tap_route_model *m = NULL;
	char why[300];
	if (tap_route_defs_load(data, len, "/", &lim, &m, why, sizeof why))
		snprintf(err, cap, "%s: %s", path, why);
	free(data);
	return m;
}

/* The model in use is now m, loaded at now_us: what --metrics shows of it. */
static void topology_in_use(struct app *app, struct tap_route_model *m, int64_t now_us)
{
	struct tap_route_counts n;
	tap_route_counts(m, &n);
	struct tap_metrics_topology *st = &app->topology_stats;
	st->polls_ok++;
	st->loaded_us = now_us;
	st->exchanges = n.exchanges;
	st->queues = n.queues;
	st->bindings = n.bindings;
	app->topology = m;
}

static void topology_log(const char *what, const struct tap_route_model *m)
{
	struct tap_route_counts n;
	tap_route_counts(m, &n);
	tap_log_info("definitions %s: %u vhosts, %u exchanges (%u of types not judged), %u queues, %u bindings, %u "
		     "policies, %llu bytes", what, n.vhosts, n.exchanges, n.unknown_type, n.queues, n.bindings, n.policies,
		     (unsigned long long)tap_route_model_bytes(m));
}

int app_topology_load(struct app *app)
{
	if (!app->conf->definitions)
		return 0;
	app->topology_stats.on = true;
	char err[400];
	struct tap_route_model *m = topology_read(app->conf->definitions, err, sizeof err);
	if (!m) {
		fprintf(stderr, "amqptap: --definitions %s\n", err);
		return 2;
	}
	if (tap_track_set_topology(app->track, m)) {
		tap_route_model_free(m);
		fprintf(stderr, "amqptap: out of memory at start\n");
		return 1;
	}
	topology_in_use(app, m, tap_now_us());
	topology_log("loaded", m);
	return 0;
}

void app_topology_reload(struct app *app)
{
	if (!app->conf->definitions || !app->track)
		return;
	char err[400];
	struct tap_route_model *m = topology_read(app->conf->definitions, err, sizeof err);
	if (!m) {
		app->topology_stats.polls_failed++;
		tap_log_error("--definitions %s; the last good definitions stay", err);
		return;
	}
	if (tap_track_set_topology(app->track, m)) {
		tap_route_model_free(m);
		app->topology_stats.polls_failed++;
		tap_log_error("--definitions: no memory for the new definitions; the last good ones stay");
		return;
	}
	tap_route_model_free(app->topology);
	topology_in_use(app, m, tap_now_us());
	topology_log("reloaded", m);
}

/* The streams the drops hit show their holes as capture_gap records. */
void app_report_drops(struct app *app, uint64_t fresh, uint64_t total, int64_t now_us)
{
	struct tap_buf b;
	tap_buf_init(&b);
	struct tap_json j;
	tap_record_begin_once(&j, &b, "capture_drops", now_us, app->run);
	tap_json_kv_uint(&j, "dropped", fresh);
	tap_json_kv_uint(&j, "total", total);
	tap_json_obj_end(&j);
	if (!b.oom)
		emit_record(app, b.data, b.len);
	tap_buf_deinit(&b);
	tap_log_error("the kernel dropped %" PRIu64 " packets (%" PRIu64 " in total): the streams they belonged to "
		      "have capture gaps; try a larger --buffer-size", fresh, total);
}

/* A `topology` record: where the model came from and what became of a poll (DESIGN §4). */
static void topology_record(struct app *app, const char *event, const char *error, int64_t age_us)
{
	struct tap_buf b;
	struct tap_json j;
	tap_buf_init(&b);
	tap_json_init(&j, &b);
	tap_json_obj_begin(&j);
	tap_json_kv_str(&j, "type", "topology");
	tap_json_kv_ts(&j, "ts", tap_now_us());
	if (app->run[0])
		tap_json_kv_str(&j, "run", app->run);
	tap_json_kv_str(&j, "event", event);
	tap_json_kv_str(&j, "source", "management");
	if (error)
		tap_json_kv_str(&j, "error", error);
	if (age_us >= 0)
		tap_json_kv_int(&j, "age_s", age_us / 1000000);
	tap_json_obj_end(&j);
	if (!b.oom)
		emit_record(app, b.data, b.len);
	tap_buf_deinit(&b);
}

static void on_polled(void *arg, const char *body, size_t len, const char *err)
{
	struct app *app = arg;
	char why[400];
	struct tap_route_model *m = NULL;
	if (!err) {
		struct tap_route_defs_limits lim;
		tap_route_defs_limits_default(&lim);
		if (tap_route_defs_load(body, len, "/", &lim, &m, why, sizeof why) == 0 &&
		    tap_track_set_topology(app->track, m) != 0) {
			tap_route_model_free(m);
			m = NULL;
			snprintf(why, sizeof why, "no memory for the new definitions");
		}
		err = m ? NULL : why;
	}
	int64_t now = tap_now_us();
	if (m) {
		tap_route_model_free(app->topology);
		topology_in_use(app, m, now);
		if (app->mgmt_failing || !app->topology_at_first || app->conf->verbosity >= TAP_VERBOSITY_VERBOSE) {
			topology_log("polled", m);
			topology_record(app, "loaded", NULL, -1);
		}
		app->mgmt_failing = false;
		app->topology_at_first = true;
		return;
	}
	app->topology_stats.polls_failed++; /* every one; the record and the log line say the first of a run */
	int64_t age = app->topology ? now - app->topology_stats.loaded_us : -1;
	if (!app->mgmt_failing) {
		tap_log_error("--management: %s; %s", err,
			      app->topology ? "the last good definitions stay" : "no definitions yet: nothing is judged");
		topology_record(app, app->topology ? "stale" : "poll_failed", err, age);
	}
	app->mgmt_failing = true;
}

int app_topology_poll(struct app *app)
{
	const struct tap_conf *conf = app->conf;
	if (!conf->management)
		return 0;
	app->topology_stats.on = true;
	char *cred = NULL, err[400];
	if (conf->management_credentials && tap_mgmt_credentials_read(conf->management_credentials, &cred, err,
								      sizeof err)) {
		fprintf(stderr, "amqptap: --management-credentials %s\n", err);
		return 2;
	}
	struct tap_route_defs_limits lim;
	tap_route_defs_limits_default(&lim);
	app->mgmt = tap_mgmt_new(app->base, conf->management, cred, conf->management_ca,
				 (int64_t)conf->topology_interval_s * 1000000, lim.max_input, on_polled, app, err, sizeof err);
	tap_mgmt_credentials_free(cred);
	if (!app->mgmt) {
		fprintf(stderr, "amqptap: --management %s\n", err);
		return 2;
	}
	return 0;
}
