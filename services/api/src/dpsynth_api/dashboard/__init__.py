"""The budget dashboard: a static page served by the api that reads only the public REST
endpoints with the key the user typed (kept in sessionStorage, sent as a Bearer header)."""
