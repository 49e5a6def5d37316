/* /metrics for --definitions and --management (issue 36): the reads of the definitions by result, from the start
 * and with no model yet; the model's age and size only while there is one; nothing of it without either option. */
#include "amqptap/metrics.h"

#include <check.h>

#include "tap_check.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *render(const struct tap_metrics_snapshot *s)
{
	struct tap_metrics_tally *t = malloc(sizeof *t);
	ck_assert_ptr_nonnull(t);
	tap_metrics_tally_init(t);
	struct tap_buf b;
	tap_buf_init(&b);
	tap_metrics_render_prometheus(s, t, &b);
	ck_assert(!b.oom);
	char *text = malloc(b.len + 1);
	ck_assert_ptr_nonnull(text);
	memcpy(text, b.data, b.len);
	text[b.len] = '\0';
	tap_buf_deinit(&b);
	free(t);
	return text;
}

START_TEST(no_topology_no_family)
{
	struct tap_metrics_snapshot s = {.version = "1", .listening = true, .now_us = 5000000};
	char *text = render(&s);
	ck_assert_ptr_null(strstr(text, "amqptap_topology_"));
	free(text);
}
END_TEST

START_TEST(failed_polls_before_any_model)
{
	struct tap_metrics_snapshot s = {.version = "1", .now_us = 5000000};
	s.topology = (struct tap_metrics_topology){.on = true, .polls_failed = 3};
	char *text = render(&s);
	ck_assert_ptr_nonnull(strstr(text, "# TYPE amqptap_topology_polls_total counter\n"
	                                   "amqptap_topology_polls_total{result=\"ok\"} 0\n"
	                                   "amqptap_topology_polls_total{result=\"failed\"} 3\n"));
	/* no model: no age (an alert on the age would take 0 for fresh), no sizes */
	ck_assert_ptr_null(strstr(text, "amqptap_topology_age_seconds"));
	ck_assert_ptr_null(strstr(text, "amqptap_topology_queues"));
	free(text);
}
END_TEST

START_TEST(the_model_in_use_its_age_and_size)
{
	struct tap_metrics_snapshot s = {.version = "1", .now_us = 100250000};
	s.topology = (struct tap_metrics_topology){.on = true, .polls_ok = 7, .polls_failed = 2, .loaded_us = 40000000,
	                                           .exchanges = 9, .queues = 4, .bindings = 12};
	char *text = render(&s);
	ck_assert_ptr_nonnull(strstr(text, "amqptap_topology_polls_total{result=\"ok\"} 7\n"
	                                   "amqptap_topology_polls_total{result=\"failed\"} 2\n"));
	ck_assert_ptr_nonnull(strstr(text, "# TYPE amqptap_topology_age_seconds gauge\n"
	                                   "amqptap_topology_age_seconds 60.250\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_topology_exchanges 9\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_topology_queues 4\n"));
	ck_assert_ptr_nonnull(strstr(text, "\namqptap_topology_bindings 12\n"));
	/* a clock stepped back never shows a negative age */
	s.now_us = 1000000;
	free(text);
	text = render(&s);
	ck_assert_ptr_nonnull(strstr(text, "amqptap_topology_age_seconds 0.000\n"));
	free(text);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("metrics_topology");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, no_topology_no_family);
	tcase_add_test(tc, failed_polls_before_any_model);
	tcase_add_test(tc, the_model_in_use_its_age_and_size);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
