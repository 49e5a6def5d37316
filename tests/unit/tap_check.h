/* Shared by the check suites: run one suite and count its failures. */
#ifndef TAP_CHECK_H
#define TAP_CHECK_H

#include <check.h>

/* Runs every test of s (forked per test unless CK_FORK=no) and returns how
 * many failed; frees the suite. */
static inline int tap_check_failures(Suite *s)
{
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed;
}

#endif
