"""Virtual-time simulator over the same router, instance core and cold-pool scheduler the daemon
runs, with `sim` executor costs from the profiles in `talariad.perfmodel.profiles`: `simulator.simulate`,
named suites in `configs`, the `compare` CLI in `__main__`."""
