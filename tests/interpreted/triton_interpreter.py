"""Triton's interpreter made able to run flash-linear-attention's kernels on a CPU, for the tests only.

Two gaps between the interpreter (``TRITON_INTERPRET=1``: a kernel's Python run over NumPy arrays) and the
compiler stand in the way, neither about the numbers:

- An autotuned kernel times each of its configurations first, and timing asks for a GPU driver: here every
  configuration "takes" the same time, so the first one runs.
- The compiler makes a ``for`` loop's index a Triton scalar; the interpreter leaves it a Python int, and fla's
  kernels call ``.to(tl.int64)`` on it. The interpreter already turns every assigned value into a Triton scalar
  (its ``visit_Assign``); ``visit_For`` here does the same for the loop index.

Import this module before fla (with ``TRITON_INTERPRET=1`` set: Triton reads it when a kernel is defined).
"""

from __future__ import annotations

import ast

from triton.runtime import autotuner, interpreter


def _same_time(self):
    return lambda kernel_call, quantiles=None: [0.0, 0.0, 0.0]


def _visit_for(self, node):
    node = self.generic_visit(node)
    if isinstance(node.target, ast.Name):  # i = interpreter_semantic.to_tensor(i, False), first in the body
        to_tensor = ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()), attr="to_tensor",
                                  ctx=ast.Load())
        rebind = ast.Assign(targets=[ast.Name(id=node.target.id, ctx=ast.Store())],
                            value=ast.Call(func=to_tensor, args=[ast.Name(id=node.target.id, ctx=ast.Load()),
                                                                 ast.Constant(value=False)], keywords=[]))
        node.body.insert(0, ast.fix_missing_locations(ast.copy_location(rebind, node)))
    return node


autotuner.Autotuner.do_bench = property(_same_time)
interpreter.ASTTransformer.visit_For = _visit_for
