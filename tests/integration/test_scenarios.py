# Per-publish verdicts against the real broker (src/DESIGN.md §7 scenarios 1-10 and the proxy's own shutdown), through the
# proxy: every entry of scenario_table that the proxy driver runs, pika and rabbitmq-c publishing through the tap.
# Every entry checks the invariant — one `publish` record per basic.publish, matched by the message_id each publish
# carries (or its seq) — and the route / confirm / reply_code / order the broker's answer implies.

from tapharness import main
from scenario_lib import ScenarioCase
from scenario_table import CaseRun, for_each_scenario


@for_each_scenario("proxy")
class ProxyScenarios(ScenarioCase):
    def check(self, scenario):
        """Drives the scenario through a tap with its options, stops the tap (exit 0), checks its records."""
        tap = self.start_tap(list(scenario.tap_args))
        facts = scenario.drive(CaseRun(self, tap.port, tap))
        rc = tap.stop()
        self.assertEqual(rc, 0, f"amqptap exited {rc}: {tap.stderr()[-2000:]}")
        scenario.expect(self, tap, facts)


if __name__ == "__main__":
    main()
