"""Element types and reductions, with the codes the core uses (csrc/common/dtype.h's
DataType and ReduceOp; tests/test_enums_match_core.py checks them against the header)."""

UINT8, INT8, INT32, INT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64, BOOL, UINT16, INT16 = range(11)

NAMES = {
    UINT8: "uint8",
    INT8: "int8",
    INT32: "int32",
    INT64: "int64",
    FLOAT16: "float16",
    BFLOAT16: "bfloat16",
    FLOAT32: "float32",
    FLOAT64: "float64",
    BOOL: "bool",
    UINT16: "uint16",
    INT16: "int16",
}
CODE_BY_NAME = {v: k for k, v in NAMES.items()}
# Bytes per element of each code (the core's DataTypeSize).
ITEM_BYTES = {
    UINT8: 1,
    INT8: 1,
    INT32: 4,
    INT64: 8,
    FLOAT16: 2,
    BFLOAT16: 2,
    FLOAT32: 4,
    FLOAT64: 8,
    BOOL: 1,
    UINT16: 2,
    INT16: 2,
}


class ReduceOp(int):
    """A reduction, printable by name; compares equal to its core code."""

    _name: str

    def __new__(cls, code: int, name: str) -> "ReduceOp":
        obj = int.__new__(cls, code)
        obj._name = name
        return obj

    def __repr__(self) -> str:
        return self._name

    __str__ = __repr__


Sum = ReduceOp(0, "Sum")
Average = ReduceOp(1, "Average")
Min = ReduceOp(2, "Min")
Max = ReduceOp(3, "Max")
Product = ReduceOp(4, "Product")
Adasum = ReduceOp(5, "Adasum")
REDUCE_OPS = (Sum, Average, Min, Max, Product, Adasum)
