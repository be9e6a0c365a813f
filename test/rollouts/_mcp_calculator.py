"""A stdio MCP server offering one tool (``add``), started by ``test_env_factory``."""

from mcp.server.fastmcp import FastMCP

server = FastMCP("calculator")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two whole numbers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
