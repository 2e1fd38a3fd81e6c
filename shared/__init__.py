"""Code every Tessera service uses: the event contract, the config, the bus and the pure core."""
