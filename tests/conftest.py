import jax

# cpu-N topologies need host devices, fixed when JAX's CPU backend starts.
jax.config.update("jax_num_cpu_devices", 8)

pytest_plugins = ["pytester"]
