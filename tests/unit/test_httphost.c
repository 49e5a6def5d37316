/* The --metrics endpoint's Host check (tap_http_host_allowed): addresses, localhost, the machine's name and the
 * --metrics-host list pass; any other name, an empty or overlong Host, a bad literal do not. */
#include "amqptap/httphost.h"

#include <check.h>

#include "tap_check.h"
#include <stdlib.h>
#include <string.h>

START_TEST(addresses_and_localhost_pass)
{
	const char *ok[] = {"127.0.0.1", "127.0.0.1:9464", "10.1.2.3:80", "[::1]", "[::1]:9464", "[fe80::1]:1",
			    "localhost", "LocalHost:9464", "localhost.", "a.localhost", "x.y.LOCALHOST:1"};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
		ck_assert_msg(tap_http_host_allowed(ok[i], NULL, NULL), "%s", ok[i]);
	ck_assert(tap_http_host_allowed(NULL, NULL, NULL)); /* no Host: HTTP/1.0 */
}
END_TEST

START_TEST(other_names_are_refused)
{
	const char *bad[] = {"evil.example", "evil.example:9464", "127.0.0.1.evil.example", "localhost.evil.example",
			     "", ":9464", "[::1", "[not-an-address]:1", "[::1]x", "xlocalhost", "1.2.3", "999.1.1.1"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ck_assert_msg(!tap_http_host_allowed(bad[i], "tap-01", NULL), "%s", bad[i]);
	char big[400];
	memset(big, 'a', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	ck_assert(!tap_http_host_allowed(big, NULL, big));
}
END_TEST

START_TEST(this_host_and_the_list_pass)
{
	ck_assert(tap_http_host_allowed("tap-01", "tap-01", NULL));
	ck_assert(tap_http_host_allowed("TAP-01:9464", "tap-01", NULL));
	ck_assert(!tap_http_host_allowed("tap-0", "tap-01", NULL));
	const char *list = "metrics.example.com,amqptap.ns.svc";
	ck_assert(tap_http_host_allowed("metrics.example.com:9464", NULL, list));
	ck_assert(tap_http_host_allowed("amqptap.ns.svc.", NULL, list));
	ck_assert(tap_http_host_allowed("AMQPTAP.NS.SVC", NULL, list));
	ck_assert(!tap_http_host_allowed("example.com", NULL, list));
	ck_assert(!tap_http_host_allowed("amqptap.ns", NULL, list));
	ck_assert(!tap_http_host_allowed("svc", NULL, list));
	ck_assert(!tap_http_host_allowed("x", NULL, ",,")); /* empty entries match nothing */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("httphost");
	TCase *tc = tcase_create("core");
	tcase_add_test(tc, addresses_and_localhost_pass);
	tcase_add_test(tc, other_names_are_refused);
	tcase_add_test(tc, this_host_and_the_list_pass);
	suite_add_tcase(s, tc);
	int failed = tap_check_failures(s);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
