"""Sets up IBM ContextForge (`mcp-contextforge-gateway`) in front of one upstream for leg j of
scripts/interop, through its documented admin API, and writes the verifier's identity files.

Usage: .tools/contextforge/bin/python contextforge_setup.py GATEWAY_BASE UPSTREAM_URL OUT_DIR

Run in the folder holding ContextForge's `.env` (JWT_SECRET_KEY, PLATFORM_ADMIN_EMAIL). Steps,
as its documentation gives them:
  1. an admin token from `python -m mcpgateway.utils.create_jwt_token`;
  2. the upstream registered (`POST /gateways`, transport STREAMABLEHTTP) and a virtual server
     holding its tools (`POST /servers`): its MCP endpoint is /v1/virtual-servers/<id>/mcp;
  3. three users (`POST /auth/email/admin/users`), alice and bob members of team acme, carol of
     team globex (`POST /teams/`, `POST /teams/<id>/members`): a user may call tools only
     through a team;
  4. a team-bound token for each (`create_jwt_token --username U --teams TEAM`), written to
     OUT_DIR/<name>.toml as a `palisade verify --identity` file (tenant = the team's name).
Prints the MCP endpoint's URL on its last line. Exits non-zero, saying which step failed.
"""

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request


def env_file(path=".env"):
    values = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                values[key] = value
    return values


ENV = env_file()


def mint(username, teams=None):
    """A JWT from ContextForge's own token tool, signed with the gateway's secret."""
    cmd = [sys.executable, "-m", "mcpgateway.utils.create_jwt_token", "--username", username, "--exp", "120",
           "--secret", ENV["JWT_SECRET_KEY"]]
    if teams:
        cmd += ["--teams", teams]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()
    if not out:
        sys.exit(f"contextforge_setup: create_jwt_token printed no token for {username}")
    return out[-1].strip()


class Api:
    def __init__(self, base, token):
        self.base = base.rstrip("/")
        self.token = token

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Content-Type", "application/json")
        request.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                return error.code, json.loads(text)
            except ValueError:
                return error.code, text

    def ok(self, method, path, body, what):
        status, answer = self.call(method, path, body)
        if status >= 300:
            sys.exit(f"contextforge_setup: {what}: {method} {path} -> {status} {str(answer)[:300]}")
        return answer


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: contextforge_setup.py GATEWAY_BASE UPSTREAM_URL OUT_DIR")
    base, upstream, out_dir = sys.argv[1:]
    admin_email = ENV.get("PLATFORM_ADMIN_EMAIL", "admin@example.com")
    api = Api(base, mint(admin_email))

    gateway = api.ok("POST", "/gateways", {"name": "upstream", "url": upstream, "transport": "STREAMABLEHTTP"},
                     "register the upstream")
    tool_ids = []
    for _ in range(50):  # its tools are listed once the gateway has connected to the upstream
        tools = api.ok("GET", "/tools", None, "list the tools")
        tools = tools if isinstance(tools, list) else tools.get("items", [])
        tool_ids = [t["id"] for t in tools if t.get("gatewayId", gateway["id"]) == gateway["id"]]
        if tool_ids:
            break
        time.sleep(0.2)
    if not tool_ids:
        sys.exit("contextforge_setup: the registered upstream's tools never appeared in GET /tools")
    server = api.ok("POST", "/servers", {"server": {"name": "interop", "associated_tools": tool_ids}},
                    "create the virtual server")

    teams = {}
    for team in ("acme", "globex"):
        teams[team] = api.ok("POST", "/teams/", {"name": team, "visibility": "private"}, f"create team {team}")["id"]
    for name, team, client in (("alice", "acme", "web"), ("bob", "acme", "web"), ("carol", "globex", "cli")):
        email = f"{name}@example.com"
        for attempt in range(5):  # its password policy refuses some random strings (runs of sequential characters)
            password = f"Q{secrets.token_urlsafe(18)}!7z"
            status, answer = api.call("POST", "/auth/email/admin/users",
                                      {"email": email, "password": password, "full_name": name, "is_admin": False})
            if status < 300:
                break
            if attempt == 4 or "assword" not in str(answer):
                sys.exit(f"contextforge_setup: create user {email}: {status} {str(answer)[:300]}")
        api.ok("POST", f"/teams/{teams[team]}/members", {"email": email, "role": "member"}, f"add {email} to {team}")
        token = mint(email, teams[team])
        with open(os.path.join(out_dir, f"{name}.toml"), "w", encoding="utf-8") as handle:
            handle.write(f'name = "{name}"\ntoken = "{token}"\ntenant = "{team}"\nclient = "{client}"\nsubject = "{email}"\n')
    print(f"contextforge_setup: upstream {gateway['id']} with {len(tool_ids)} tool(s), teams acme and globex, "
          "alice, bob and carol")
    print(f"{base.rstrip('/')}/v1/virtual-servers/{server['id']}/mcp")


if __name__ == "__main__":
    main()
