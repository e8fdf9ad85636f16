"""The node's typed configuration: TOML plus ``P2PTRAIN_<SECTION>__<KEY>`` overrides, one line per problem.

- ``schema``     every section and field (pydantic, ``extra="forbid"``) and ``load_config``
- ``checks``     what types cannot say: names, references, addresses, hosts, directories
- ``errors``     a validation error as the one line a user sees, naming the dotted field and its source
- ``tomlfile``   reading the file and the environment overrides (stdlib only)
- ``tomlwrite``  a deterministic TOML writer for what p2ptrain writes
- ``windows``    volunteer time windows ("Mon-Fri 19:00-08:00")
- ``template``   the commented template every key with its default

May import: the stdlib, pydantic, multiaddr and the stdlib-only modules at the top; this package's
``__init__`` stays empty so that ``tomlfile`` loads without pydantic.
"""
