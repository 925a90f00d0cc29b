"""Protocol: what aiolock keeps in Redis (key layouts, the kinds' declarations) and the Lua scripts
that change it, with the one runner that sends them.
"""
