/* The option table: defaults, every accepted form, and one clear message
 * naming the option for every bad one. */
#include "amqptap/conf.h"
#include "amqptap/status.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

static int parse(struct tap_conf *c, char *err, size_t cap, int argc, char **argv)
{
	tap_conf_defaults(c);
	return tap_conf_parse(c, argc, argv, err, cap);
}

#define PARSE(c, err, ...)                                                                                      \
	({                                                                                                      \
		char *argv_[] = {"amqptap", __VA_ARGS__};                                                       \
		parse(c, err, sizeof err, (int)(sizeof argv_ / sizeof argv_[0]), argv_);                        \
	})

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
	ck_assert_int_eq(c.mode, TAP_MODE_PROXY);
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
}
END_TEST

struct bad_case {
	const char *args[3];
	const char *names; /* the message must contain this */
};

static const struct bad_case bad_cases[] = {
	{{"--listen", "nonsense"}, "--listen"},
	{{"--listen", "127.0.0.1:70000"}, "--listen"},
	{{"--upstream", "127.0.0.1:0"}, "--upstream"},
	{{"--upstream", "::1:5672"}, "--upstream"},
	{{"--upstream", ":5672"}, "--upstream"},
	{{"--bogus-flag"}, "--bogus-flag"},
	{{"-z"}, "-z"},
	{{"--return-window", "-5"}, "--return-window"},
	{{"--return-window", "12ms"}, "--return-window"},
	{{"--max-outstanding", "99999999999"}, "--max-outstanding"},
	{{"--max-outstanding", "0"}, "--max-outstanding"},
	{{"--late-return", "0"}, "--late-return"},
	{{"--port", "5672"}, "--port"},
	{{"replay"}, "replay"},
	{{"--verdicts"}, "--verdicts"},
	{{"--verdicts", ""}, "--verdicts"},
	{{"--help=yes"}, "--help"},
	{{"stray"}, "stray"},
};

START_TEST(bad_options_name_themselves)
{
	const struct bad_case *bc = &bad_cases[_i];
	char *argv[4] = {"amqptap"};
	int argc = 1;
	for (int k = 0; k < 3 && bc->args[k]; k++)
		argv[argc++] = (char *)bc->args[k];
	struct tap_conf c;
	char err[256] = "";
	ck_assert_int_eq(parse(&c, err, sizeof err, argc, argv), TAP_E_USAGE);
	ck_assert_msg(strstr(err, bc->names) != NULL, "message '%s' does not name '%s'", err, bc->names);
	ck_assert_ptr_null(strchr(err, '\n'));
}
END_TEST

START_TEST(usage_lists_every_option)
{
	char out[4096];
	tap_conf_usage(out, sizeof out);
	const char *expect[] = {"--listen", "--upstream", "--verdicts", "--frames", "--return-window", "--help", "--version"};
	for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++)
		ck_assert_ptr_nonnull(strstr(out, expect[i]));
}
END_TEST

START_TEST(addr_format_round_trip)
{
	struct tap_conf_addr a;
	char out[300];
	ck_assert_int_eq(tap_conf_parse_addr("[fe80::1]:5672", false, &a), TAP_OK);
	tap_conf_addr_format(&a, out, sizeof out);
	ck_assert_str_eq(out, "[fe80::1]:5672");
	ck_assert_int_eq(tap_conf_parse_addr("broker.example:5671", false, &a), TAP_OK);
	tap_conf_addr_format(&a, out, sizeof out);
	ck_assert_str_eq(out, "broker.example:5671");
}
END_TEST

int main(void)
{
	Suite *s = suite_create("conf");
	TCase *tc = tcase_create("parse");
	tcase_add_test(tc, defaults);
	tcase_add_test(tc, accepted_forms);
	tcase_add_loop_test(tc, bad_options_name_themselves, 0, (int)(sizeof bad_cases / sizeof bad_cases[0]));
	tcase_add_test(tc, usage_lists_every_option);
	tcase_add_test(tc, addr_format_round_trip);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
