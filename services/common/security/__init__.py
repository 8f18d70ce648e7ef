"""TLS and access control shared by every RocketQ service (DESIGN.md §11).

- :mod:`.tls`: server credentials that follow their certificate files; config checks.
- :mod:`.certs`: a throwaway CA (``rocketq dev up --tls``, tests).
- :mod:`.acl`: users, permissions, signature checks and the server interceptor.
- :mod:`.settings`: the config keys every service takes and :class:`ServiceSecurity`, what a
  service's server and its own clients need from them.
"""
