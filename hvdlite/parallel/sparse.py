"""Where the rows and columns of sharded embedding tables live: the layout of one table over the
members of a process set, and the planner that picks a sharding per table from the tables' sizes
and a per-member memory budget. Pure logic (no framework, no collective): every member computes
the same answer from the same arguments, which is what lets them agree without talking.

Shardings of a V x D table over N members (member = position in the process set):
  "row"     member m holds rows [m*B, min(V, (m+1)*B)), B = ceil(V/N), all D columns
  "column"  member m holds every row and columns [c_m, c_{m+1}) (D split as evenly as possible,
            the first D % N members one column more); needs D >= N
  "table"   member `owner` holds the whole table, the others nothing
"""

from dataclasses import dataclass

from hvdlite.common import exceptions

SHARDINGS = ("row", "column", "table")

# Optimizer-state bytes per table row, as a function of the row width in columns (fp32 state).
STATE_BYTES_PER_ROW = {
    "sgd": lambda width: 0,
    "adagrad": lambda width: 4,  # one accumulator per row (row-wise Adagrad)
    "adam": lambda width: 8 * width,  # first and second moments per element (lazy Adam)
}


@dataclass(frozen=True)
class TableLayout:
    """One table's placement. `rows`, `dim`: the whole table's shape; `members`: the set's size;
    `holders`: the members that hold parts of it (None: all; in the parameter-server mode, the
    servers), the sharding splits the table over them in this order; `owner`: the member
    holding the table when sharding == "table"."""

    rows: int
    dim: int
    sharding: str
    members: int
    owner: int = 0
    holders: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.sharding not in SHARDINGS:
            raise exceptions.InvalidArgumentError(
                "sharding must be one of %s, got %r" % (", ".join(SHARDINGS), self.sharding)
            )
        if self.sharding == "column" and self.dim < len(self.holding()):
            raise exceptions.InvalidArgumentError(
                "column sharding of a table of dim %d over %d members leaves members without a "
                "column; use sharding='row' or 'table'" % (self.dim, len(self.holding()))
            )
        if self.sharding == "table" and self.owner not in self.holding():
            raise exceptions.InvalidArgumentError(
                "table owner %d is not among the holders %s" % (self.owner, list(self.holding()))
            )

    def holding(self):
        return tuple(range(self.members)) if self.holders is None else tuple(self.holders)

    @property
    def row_block(self):
        return -(-self.rows // len(self.holding()))

    def _slot(self, member):
        holding = self.holding()
        return holding.index(member) if member in holding else None

    def row_range(self, member):
        """[first, last) rows member `member` holds."""
        slot = self._slot(member)
        if slot is None or (self.sharding == "table" and member != self.owner):
            return 0, 0
        if self.sharding == "row":
            first = min(self.rows, slot * self.row_block)
            return first, min(self.rows, first + self.row_block)
        return 0, self.rows

    def col_range(self, member):
        """[first, last) columns member `member` holds (all of them unless column-sharded)."""
        slot = self._slot(member)
        if self.sharding != "column" or slot is None:
            return (0, self.dim) if self.row_range(member)[1] > self.row_range(member)[0] else (0, 0)
        base, extra = divmod(self.dim, len(self.holding()))
        first = slot * base + min(slot, extra)
        return first, first + base + (1 if slot < extra else 0)

    def shard_shape(self, member):
        r0, r1 = self.row_range(member)
        c0, c1 = self.col_range(member)
        return r1 - r0, c1 - c0

    def serving_members(self):
        """The members holding part of the table, in member order."""
        return [m for m in range(self.members) if self.shard_shape(m)[0] and self.shard_shape(m)[1]]


def table_bytes(rows, dim, optimizer):
    """Bytes of a rows x dim fp32 table and its optimizer state."""
    return rows * dim * 4 + rows * STATE_BYTES_PER_ROW[optimizer](dim)


def plan_tables(tables, members, memory_budget=None, optimizer="sgd", holders=None):
    """Picks a TableLayout for each table of `tables` ({name: (rows, dim)}) over the `holders`
    (default: all `members` members) holding at most `memory_budget` bytes of tables and
    optimizer state each (None: no limit). Greedy, largest table first: a table no bigger than
    an even share of the whole goes whole to the least-loaded holder it fits on (table
    sharding: its lookups cost one owner); a bigger one is split by rows over every holder (by
    columns when it has fewer rows than holders). Raises InvalidArgumentError naming the table
    when the budget cannot hold it."""
    if optimizer not in STATE_BYTES_PER_ROW:
        raise exceptions.InvalidArgumentError("unknown optimizer %r" % (optimizer,))
    holding = tuple(range(members)) if holders is None else tuple(holders)
    budget = float("inf") if memory_budget is None else memory_budget
    sizes = {name: table_bytes(int(r), int(d), optimizer) for name, (r, d) in tables.items()}
    even_share = sum(sizes.values()) / len(holding)
    load = dict.fromkeys(holding, 0)
    plan = {}
    for name in sorted(tables, key=lambda n: (-sizes[n], n)):
        rows, dim = (int(x) for x in tables[name])
        least = min(holding, key=lambda m: (load[m], m))
        if len(holding) == 1 or (sizes[name] <= even_share and load[least] + sizes[name] <= budget):
            sharding = "table"
        elif rows >= len(holding) or dim < len(holding):
            sharding = "row"
        else:
            sharding = "column"
        layout = plan[name] = TableLayout(rows, dim, sharding, members, least, holders)
        for m in holding:
            r, c = layout.shard_shape(m)
            load[m] += table_bytes(r, c, optimizer)
        if max(load.values()) > budget:
            raise exceptions.InvalidArgumentError(
                "table %r (%d x %d, %d bytes with %s state) does not fit a budget of %d bytes per "
                "member over %d members (needs %d); raise memory_budget or add members"
                % (name, rows, dim, sizes[name], optimizer, budget, len(holding), max(load.values()))
            )
    return plan
