"""The service interface: local tools reach the job service in its own terms.

``wire`` is the format (JSON objects, one per line; standard library only), ``terms`` the
service's types as the interface carries them, ``server`` one connection served over the
job service, ``client`` the trio client the Invoke Server and the job list commands use.
"""
