"""Virtual-time simulator over the same router, instance core and cold-pool scheduler the daemon
runs, with `sim` executor costs from the profiles in `talariad.sim.profiles`: `simulator.simulate`,
named suites in `configs`, the `compare` CLI in `__main__`."""
